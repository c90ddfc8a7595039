module github.com/fusebox-llm/fusebox/test/bench

go 1.26.8

require github.com/fusebox-llm/fusebox v0.0.0

require github.com/sony/gobreaker/v2 v2.4.0

require (
	github.com/bits-and-blooms/bitset v1.24.4 // indirect
	github.com/failsafe-go/failsafe-go v0.9.8
)

replace github.com/fusebox-llm/fusebox => ../..
