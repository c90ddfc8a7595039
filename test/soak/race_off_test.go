//go:build !race

package main

// raceBuild: the soak runs under the race detector, where each request
// costs several times its CPU (race_on_test.go).
const raceBuild = false
