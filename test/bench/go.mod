module github.com/fusebox-llm/fusebox/test/bench

go 1.26.8

require github.com/fusebox-llm/fusebox v0.0.0

require github.com/sony/gobreaker/v2 v2.4.0

replace github.com/fusebox-llm/fusebox => ../..
