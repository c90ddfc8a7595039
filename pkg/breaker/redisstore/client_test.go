package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestNewClientForms(t *testing.T) {
	cases := []struct {
		url  string
		kind string
		ok   bool
	}{
		{"redis://127.0.0.1:6379/0", "single", true},
		{"redis://user:secret@127.0.0.1:6379/2", "single", true},
		{"rediss://redis.internal:6380/0", "single", true},
		{"redis://127.0.0.1:7000?addrs=127.0.0.1:7001,127.0.0.1:7002", "cluster", true},
		{"redis://127.0.0.1:7000?addr=127.0.0.1:7001", "cluster", true},
		{"redis://127.0.0.1:26379?master_name=mymaster", "sentinel", true},
		{"http://127.0.0.1:6379", "", false},
		{"redis://127.0.0.1:6379?nonsense=1", "", false},
	}
	for _, tc := range cases {
		c, err := NewClient(tc.url)
		if (err == nil) != tc.ok {
			t.Fatalf("%s: err %v", tc.url, err)
		}
		if err != nil {
			continue
		}
		kind := "single"
		switch cl := c.(type) {
		case *redis.ClusterClient:
			kind = "cluster"
			if n := len(cl.Options().Addrs); n < 2 {
				t.Fatalf("%s: %d addresses", tc.url, n)
			}
		case *redis.Client:
			o := cl.Options()
			if tc.kind == "single" && tc.url[:7] == "rediss:" && o.TLSConfig == nil {
				t.Fatalf("%s: no TLS", tc.url)
			}
			if o.Password == "secret" && o.Username != "user" {
				t.Fatalf("%s: user %q", tc.url, o.Username)
			}
			if tc.kind == "sentinel" {
				kind = "sentinel" // a failover client is a *redis.Client
			}
		}
		if kind != tc.kind {
			t.Fatalf("%s: %s client, want %s", tc.url, kind, tc.kind)
		}
		_ = c.Close()
	}
}
