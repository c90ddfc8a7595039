package envoysim

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// AccessLogConfig is an envoy.access_loggers.http_grpc logger on the
// listener (docs/envoy.md, "The access log channel").
type AccessLogConfig struct {
	Addr string // the gRPC service's address (fusebox's listener)
	// Addrs are the cluster's further hosts (several fusebox replicas).
	Addrs   []string
	LogName string
	// Workers is how many worker threads log (Envoy's --concurrency); each
	// has its own stream, opened to the host the round robin picks at its
	// first entry, and a request's entry goes out on the stream of the
	// worker that served its downstream connection. 0 = 1.
	Workers int
	// Flags is the response_flag_filter: only entries with one of these
	// flags are written. With no flag listed, FlagFilter says whether a
	// response_flag_filter is configured at all: Envoy's filter with an
	// empty list writes entries with any flag set
	// (ResponseFlagFilter::evaluate, hasAnyResponseFlag); no filter writes
	// every entry. Before, an empty list wrote every entry.
	Flags      []string
	FlagFilter bool
	// BufferSizeBytes: 0 sends each entry at once; otherwise entries wait
	// until that many bytes or the flush interval (1 s).
	BufferSizeBytes int
}

// flagNames are Envoy's short names of the bits fusebox's filter uses.
var flagNames = map[string]uint64{
	"UH": flagUH, "UT": flagUT, "LR": flagLR, "UR": flagUR, "UF": flagUF, "UC": flagUC, "UO": flagUO,
	"NR": flagNR, "DC": flagDC, "DR": flagDR, "URX": flagURX, "UPE": flagUPE, "NC": flagNC,
	"SI": flagSI, "UMSDR": flagUMSDR, "DT": flagDT,
}

// accessLogger is the logger of each worker.
type accessLogger struct {
	workers []*workerLogger
	next    atomic.Uint64
}

// workerLogger is one worker's gRPC stream, reopened after an error.
type workerLogger struct {
	cfg     AccessLogConfig
	cluster *grpcCluster

	mu      sync.Mutex
	stream  accesslogv3.AccessLogService_StreamAccessLogsClient
	cancel  context.CancelFunc
	pending []*accesslogdatav3.HTTPAccessLogEntry
	size    int
	timer   *time.Timer
	sent    int
}

func newAccessLogger(cfg AccessLogConfig, c *grpcCluster) *accessLogger {
	if cfg.LogName == "" {
		cfg.LogName = "fusebox"
	}
	l := &accessLogger{}
	for range max(cfg.Workers, 1) {
		l.workers = append(l.workers, &workerLogger{cfg: cfg, cluster: c})
	}
	return l
}

// log writes e's entry on the stream of the worker that served it (the
// proxy spreads requests over its workers in turn).
func (l *accessLogger) log(e *Entry, attempts int) {
	w := l.workers[(l.next.Add(1)-1)%uint64(len(l.workers))]
	w.log(e, attempts)
}

func (l *accessLogger) close() {
	for _, w := range l.workers {
		w.close()
	}
}

// wants applies the response_flag_filter.
func (l *workerLogger) wants(flags uint64) bool {
	if len(l.cfg.Flags) == 0 {
		return !l.cfg.FlagFilter || flags != 0
	}
	for _, f := range l.cfg.Flags {
		if flags&flagNames[f] != 0 {
			return true
		}
	}
	return false
}

// log writes e's entry when the stream completes, as Envoy does.
func (l *workerLogger) log(e *Entry, attempts int) {
	if !l.wants(e.Flags) {
		return
	}
	entry := entryProto(e, attempts)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pending = append(l.pending, entry)
	l.size += 256 // about what one entry costs; only the threshold matters
	if l.cfg.BufferSizeBytes == 0 || l.size >= l.cfg.BufferSizeBytes {
		l.flushLocked()
		return
	}
	if l.timer == nil {
		l.timer = time.AfterFunc(time.Second, func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			l.timer = nil
			l.flushLocked()
		})
	}
}

func (l *workerLogger) flushLocked() {
	if len(l.pending) == 0 {
		return
	}
	if l.stream == nil {
		ctx, cancel := context.WithCancel(context.Background())
		s, err := accesslogv3.NewAccessLogServiceClient(l.cluster.pick()).StreamAccessLogs(ctx)
		if err != nil {
			cancel()
			l.pending, l.size = nil, 0 // Envoy drops what it cannot send
			return
		}
		l.stream, l.cancel = s, cancel
		// onRemoteClose: when the server ends the stream (fusebox stops),
		// Envoy drops it and the next flush opens a new one.
		go func() {
			var m accesslogv3.StreamAccessLogsResponse
			_ = s.RecvMsg(&m)
			l.mu.Lock()
			if l.stream == s {
				l.stream = nil
				cancel()
			}
			l.mu.Unlock()
		}()
		// The first message carries the identifier.
		_ = s.Send(&accesslogv3.StreamAccessLogsMessage{Identifier: &accesslogv3.StreamAccessLogsMessage_Identifier{
			Node: &corev3.Node{Id: "envoysim"}, LogName: l.cfg.LogName}})
	}
	err := l.stream.Send(&accesslogv3.StreamAccessLogsMessage{LogEntries: &accesslogv3.StreamAccessLogsMessage_HttpLogs{
		HttpLogs: &accesslogv3.StreamAccessLogsMessage_HTTPAccessLogEntries{LogEntry: l.pending}}})
	if err != nil {
		l.cancel()
		l.stream = nil
	} else {
		l.sent += len(l.pending)
	}
	l.pending, l.size = nil, 0
}

func (l *workerLogger) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.timer != nil {
		l.timer.Stop()
	}
	l.flushLocked()
	if l.stream != nil {
		_ = l.stream.CloseSend()
		l.cancel()
	}
}

// entryProto is the HTTPAccessLogEntry Envoy writes for e
// (grpc_access_log_utils.cc): flags as booleans, upstream_cluster only
// when a host was picked (not for NC or UH: no host; an overflow is the
// picked host's pool refusing, so it has one),
// every dynamic metadata namespace, the code and its details.
func entryProto(e *Entry, attempts int) *accesslogdatav3.HTTPAccessLogEntry {
	f := e.Flags
	flags := &accesslogdatav3.ResponseFlags{
		NoHealthyUpstream: f&flagUH != 0, UpstreamRequestTimeout: f&flagUT != 0, LocalReset: f&flagLR != 0,
		UpstreamRemoteReset: f&flagUR != 0, UpstreamConnectionFailure: f&flagUF != 0,
		UpstreamConnectionTermination: f&flagUC != 0, UpstreamOverflow: f&flagUO != 0, NoRouteFound: f&flagNR != 0,
		DownstreamConnectionTermination: f&flagDC != 0, DownstreamRemoteReset: f&flagDR != 0, UpstreamRetryLimitExceeded: f&flagURX != 0,
		UpstreamProtocolError: f&flagUPE != 0, NoClusterFound: f&flagNC != 0,
		StreamIdleTimeout: f&flagSI != 0, UpstreamMaxStreamDurationReached: f&flagUMSDR != 0, DurationTimeout: f&flagDT != 0,
	}
	cp := &accesslogdatav3.AccessLogCommon{
		StartTime: timestamppb.New(e.Start), Duration: durationpb.New(time.Since(e.Start)), ResponseFlags: flags,
		UpstreamRequestAttemptCount: uint32(attempts),
	}
	if f&(flagNC|flagUH) == 0 {
		cp.UpstreamCluster = e.Cluster
	}
	if len(e.Metadata) > 0 {
		cp.Metadata = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{}}
		for ns, v := range e.Metadata {
			cp.Metadata.FilterMetadata[ns] = v
		}
	}
	return &accesslogdatav3.HTTPAccessLogEntry{
		CommonProperties: cp,
		Response:         &accesslogdatav3.HTTPResponseProperties{ResponseCode: wrapperspb.UInt32(uint32(e.Status)), ResponseCodeDetails: e.Details},
	}
}

// CloseAccessLogStreams ends every worker's access log stream, as a
// measure of what a load left behind closes idle connections: Envoy keeps
// the streams open for as long as it lives, and the server's buffers for
// one are a connection's, not the load's. A later entry opens a new one.
func (p *Proxy) CloseAccessLogStreams() {
	if p.accessLog == nil {
		return
	}
	for _, w := range p.accessLog.workers {
		w.mu.Lock()
		w.flushLocked()
		if w.stream != nil {
			_ = w.stream.CloseSend()
			w.cancel()
			w.stream = nil
		}
		w.mu.Unlock()
	}
}

// AccessLogStreamsOpen reports how many of the workers' access log streams
// are open: Envoy keeps each open for as long as it lives, so the server
// serving them holds its goroutines for them (the soak's goroutine count
// sets those apart).
func (p *Proxy) AccessLogStreamsOpen() int {
	if p.accessLog == nil {
		return 0
	}
	n := 0
	for _, w := range p.accessLog.workers {
		w.mu.Lock()
		if w.stream != nil {
			n++
		}
		w.mu.Unlock()
	}
	return n
}
