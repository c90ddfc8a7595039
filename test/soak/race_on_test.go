//go:build race

package main

// raceBuild: the soak runs under the race detector (race_off_test.go).
const raceBuild = true
