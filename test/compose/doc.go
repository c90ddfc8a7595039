// Package compose validates docker-compose.yaml with compose-go, the parser
// Docker Compose itself uses. It is its own module so that compose-go's
// large dependency tree stays out of fusebox's go.mod.
package compose
