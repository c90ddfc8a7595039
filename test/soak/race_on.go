//go:build race

package main

// raceEnabled: the race detector keeps shadow memory it never returns, so
// the process's RSS says nothing about fusebox's; the heap in use does.
const raceEnabled = true
