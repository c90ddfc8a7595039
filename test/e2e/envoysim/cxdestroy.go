package envoysim

import (
	"context"
	"errors"
	"io"
)

// A connection the upstream closes while an attempt's response is still
// incomplete is counted as Envoy's connection pool counts it
// (conn_pool_base.cc, onConnectionEvent: on a RemoteClose of a client
// closingWithIncompleteStream(), reportUpstreamCxDestroyActiveRequest;
// docs/envoy.md, "Connection failures"):
// cluster.<name>.upstream_cx_destroy_remote_with_active_rq, once per
// connection, before the response headers or after them. envoysim has one
// request per connection at a time, as Envoy's HTTP/1 pool does, so it is
// once per attempt. A close envoysim made itself (the client gone, a
// timer) is a local one, which envoysim does not count.
//
// The access log tells the two apart (%RESPONSE_CODE_DETAILS%
// upstream_reset_after_response_started: the answer had begun); envoysim
// counts those entries per cluster in
// log.upstream_reset_after_response_started.<name>, as a consumer of the
// access log would, because a long run drops its kept entries (ResetLog).
// The soak takes the one from the other: the attempts that lost their
// connection before any header.

const (
	statDestroyRemote = "upstream_cx_destroy_remote_with_active_rq"
	statResetAfter    = "log.upstream_reset_after_response_started."
)

// remoteClosed counts an attempt on cluster whose connection the upstream
// closed before its response was whole.
func (p *Proxy) remoteClosed(cluster string, afterHeaders bool) {
	p.stats.add(statDestroyRemote)
	p.stats.add("cluster." + cluster + "." + statDestroyRemote)
	if afterHeaders {
		p.stats.add(statResetAfter + cluster)
	}
}

// lostBeforeHeaders counts an attempt whose round trip failed on a
// connection it had: not a connect failure (connectFailed counts those),
// not a close of envoysim's own (its context ended: the client, a timer).
func (p *Proxy) lostBeforeHeaders(ctx context.Context, cluster string, err error) {
	if err == nil || isConnectFailure(err) || ctx.Err() != nil {
		return
	}
	p.remoteClosed(cluster, false)
}

// cxBody is an upstream response body that counts its connection's loss:
// a read that fails while the attempt's context is live is the upstream's
// close, once per body.
type cxBody struct {
	io.ReadCloser
	ctx     context.Context
	p       *Proxy
	cluster string
	lost    bool
}

func (b *cxBody) Read(buf []byte) (int, error) {
	n, err := b.ReadCloser.Read(buf)
	if err != nil && !errors.Is(err, io.EOF) && !b.lost && b.ctx.Err() == nil {
		b.lost = true
		b.p.remoteClosed(b.cluster, true)
	}
	return n, err
}
