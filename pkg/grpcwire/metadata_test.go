package grpcwire

import (
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/metadata"
)

// #50: an HPACK bomb. One 4 KB header value in the dynamic table,
// referenced 250 times in one header block, decoded 250 times and held
// for the stream's life, amplified a small block about 2,000 times (200
// streams took fusebox to 256 MB). A stream now keeps at most 16 KiB of
// metadata, and no binary (-bin) metadata at all.
func TestMetadataIsBounded(t *testing.T) {
	got := make(chan metadata.MD, 2)
	ts := serve(t, Options{}, func(s extprocv3.ExternalProcessor_ProcessServer) error {
		md, _ := metadata.FromIncomingContext(s.Context())
		got <- md
		<-s.Context().Done()
		return nil
	})
	r := dialRaw(t, ts.addr)
	big := strings.Repeat("x", 4000)
	for i, name := range []string{"x-bomb", "x-bomb-bin"} {
		h := envoyHeaders(processPath)
		for range 250 {
			h = append(h, name, big)
		}
		r.headers(uint32(1+2*i), false, h...)
		md := <-got
		n := 0
		for k, vs := range md {
			for _, v := range vs {
				n += len(k) + len(v)
			}
		}
		if n > maxMetadataBytes {
			t.Fatalf("%s: the stream keeps %d bytes of metadata", name, n)
		}
		if strings.HasSuffix(name, "-bin") && len(md[name]) != 0 {
			t.Fatalf("binary metadata decoded: %d values", len(md[name]))
		}
	}
}
