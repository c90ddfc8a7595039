// Package redisstore is the breaker.Store that keeps breaker state in
// Redis, so that every fusebox replica acts on one view of each route's
// health with a global half-open probe bound (SPEC §7).
//
// Each operation is one atomic Lua script (breaker.lua) that decides the
// transition inside Redis: one round trip per recorded outcome, none for a
// decision on a healthy route (Peek reads the replica's local view, which
// every script result refreshes). Keys of one breaker share a Cluster hash
// tag; every call has a deadline (op_timeout_ms); scripts are loaded once
// and called by SHA (go-redis reloads them on NOSCRIPT).
//
// Time: the scripts run on Redis's own clock (TIME), less each call's
// event age, in unix milliseconds (Lua numbers are doubles; milliseconds
// stay exact, nanoseconds would not). Tests with a fake clock set
// Options.TestClock, and the scripts take the caller's time instead. The
// scripts' arguments are named (MessagePack maps), and the state's fields
// are words (docs/replicas.md, "The protocol").
package redisstore
