package main

import (
	"sync/atomic"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/fusebox-llm/fusebox/test/h2spy"
	"google.golang.org/grpc"
)

// The driver's connection is Envoy's: no PING frames (Envoy pings a
// cluster's connection only for connection_keepalive, which the shipped
// configs do not set; docs/envoy.md), and its SETTINGS advertise a static
// window. Before, grpc-go's BDP estimation pinged once per round trip
// while replies flowed (303 pings in these 100 lifecycles), and every
// server under test read each ping and wrote its ack.
func TestTheDriverSendsNoPings(t *testing.T) {
	var streams, deadlines atomic.Int64
	spy, err := h2spy.Listen(serveSpy(t, deadlineSpy{deadlines: &deadlines, streams: &streams}))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(spy.Addr(), envoyDialOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	client := extprocv3.NewExternalProcessorClient(conn)
	l := newLifecycle()
	for range 50 {
		if _, err := l.run(client, nil); err != nil {
			t.Fatal(err)
		}
		if _, err := l.runObserver(client, nil); err != nil {
			t.Fatal(err)
		}
	}
	conn.Close()
	spy.Close()
	if spy.Pings() != 0 {
		t.Errorf("the driver sent %d PING frames over 100 lifecycles; Envoy sends none", spy.Pings())
	}
	if w := spy.Window(); w != envoyWindow {
		t.Errorf("the driver's SETTINGS_INITIAL_WINDOW_SIZE is %d, want %d", w, envoyWindow)
	}
	if w := spy.ConnWindow(); w != envoyConnWindow {
		t.Errorf("the driver's connection window is %d, want %d", w, envoyConnWindow)
	}
}
