// Package readme runs every command the README shows, in order, on this
// checkout: a newcomer who follows it must reach what it says.
package readme
