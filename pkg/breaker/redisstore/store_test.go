package redisstore_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fusebox-llm/fusebox/pkg/breaker"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore"
	"github.com/fusebox-llm/fusebox/pkg/breaker/redisstore/redistest"
	"github.com/fusebox-llm/fusebox/pkg/breaker/storetest"
)

// The Redis store keeps the same contract as the memory store, against a
// real redis-server.
func TestRedisStoreContract(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	var n atomic.Int64
	storetest.Run(t, func(t *testing.T, onEvent func(breaker.Event)) breaker.Store {
		return redisstore.New(redisstore.Options{Client: client, KeyPrefix: fmt.Sprintf("t%d:", n.Add(1)),
			OpTimeout: 2 * time.Second, OnEvent: onEvent})
	})
}
