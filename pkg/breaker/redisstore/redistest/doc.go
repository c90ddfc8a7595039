// Package redistest starts a real redis-server for tests: on a free port,
// in a temporary directory, stopped at the end of the test. Without
// redis-server the test is skipped, unless CI=true, where it fails.
package redistest
