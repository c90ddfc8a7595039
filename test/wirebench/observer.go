package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/pkg/routes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// The observer profile (envoy/envoy-observer.yaml, #28), as Envoy drives
// it: the route role's stream gets the request phases (headers, the
// buffered body) and replies to each; the observer's stream gets the
// response headers and the 50 chunks in observability mode, each with the
// forwarded metadata, never waiting for anything; fusebox replies nothing
// and ends the stream once it recorded the response.

// startFuseboxObserver runs fusebox on its default config with
// envoy.observer set.
func startFuseboxObserver(bin string) (*proc, error) {
	return startFuseboxObserverOn(bin, tcpListener)
}

// startFuseboxObserverOn is startFuseboxObserver on the given listener,
// with further flags.
func startFuseboxObserverOn(bin, listener string, args ...string) (*proc, error) {
	dir, err := os.MkdirTemp("", "wirebench")
	if err != nil {
		return nil, err
	}
	cfg := filepath.Join(dir, "fusebox.yaml")
	if err := os.WriteFile(cfg, append([]byte("envoy: {observer: true}\n"), routes.DefaultConfig()...), 0o600); err != nil {
		return nil, err
	}
	return startFuseboxOn(bin, listener, append([]string{"-config", cfg}, args...)...)
}

// runObserver drives one lifecycle in the observer profile; lat gets the
// request path's two round trips (the only messages anything waits for).
func (l *lifecycle) runObserver(client extprocv3.ExternalProcessorClient, lat []time.Duration) ([]time.Duration, error) {
	ctx, cancel := envoyStreamContext()
	defer cancel()
	route, err := client.Process(metadata.AppendToOutgoingContext(ctx, "x-fusebox-role", "route"))
	if err != nil {
		return lat, err
	}
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
	for _, m := range []*extprocv3.ProcessingRequest{l.reqHeaders, l.reqBody} {
		t0 := time.Now()
		if err := route.Send(m); err != nil {
			return lat, err
		}
		resp, err := route.Recv()
		if err != nil {
			return lat, err
		}
		lat = append(lat, time.Since(t0))
		// The observer filter forwards fusebox.observe only
		// (envoy-observer.yaml).
		if v := resp.GetDynamicMetadata().GetFields()["fusebox.observe"]; v != nil {
			md.FilterMetadata["fusebox.observe"] = v.GetStructValue()
		}
	}
	if md.FilterMetadata["fusebox.observe"] == nil {
		return lat, fmt.Errorf("the route role wrote no observe note (is envoy.observer set?)")
	}
	// Envoy closes the route role's stream when the response headers come
	// (no response phase), and sends them to the observer.
	_ = route.CloseSend()
	obs, err := client.Process(metadata.AppendToOutgoingContext(ctx, "x-fusebox-role", "observe"))
	if err != nil {
		return lat, err
	}
	send := func(m *extprocv3.ProcessingRequest) error {
		o := &extprocv3.ProcessingRequest{Request: m.Request, Attributes: m.Attributes, ObservabilityMode: true, MetadataContext: md}
		return obs.Send(o)
	}
	if err := send(l.respHeaders); err != nil {
		return lat, err
	}
	for _, c := range l.chunks {
		if chunkGap > 0 {
			time.Sleep(chunkGap) // tokens as an upstream streams them
		}
		if err := send(c); err != nil {
			return lat, err
		}
	}
	// fusebox ends the observer stream once it recorded the response
	// (Envoy would close it after deferred_close_timeout otherwise).
	if _, err := obs.Recv(); err != io.EOF {
		return lat, fmt.Errorf("the observer stream: want fusebox to end it, got %v", err)
	}
	if _, err := route.Recv(); err != io.EOF {
		return lat, fmt.Errorf("the route stream: want EOF, got %v", err)
	}
	return lat, nil
}
