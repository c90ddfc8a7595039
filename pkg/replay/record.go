package replay

import (
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"sync"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
)

// Recorder is `extproc record-log`: an Envoy gRPC access log service that
// writes each HTTP entry as the same JSON line the shipped access log
// writes, so replay reads either.
type Recorder struct {
	accesslogv3.UnimplementedAccessLogServiceServer
	mu  sync.Mutex
	out *bufio.Writer
	// Lines counts what was written.
	Lines int
}

// NewRecorder writes to w (call Flush before closing it).
func NewRecorder(w io.Writer) *Recorder { return &Recorder{out: bufio.NewWriter(w)} }

// StreamAccessLogs implements the service.
func (r *Recorder) StreamAccessLogs(s accesslogv3.AccessLogService_StreamAccessLogsServer) error {
	for {
		m, err := s.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		for _, e := range m.GetHttpLogs().GetLogEntry() {
			r.write(e)
		}
	}
}

// Flush writes what is buffered.
func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.Flush()
}

func (r *Recorder) write(e *accesslogdatav3.HTTPAccessLogEntry) {
	b, err := json.Marshal(EntryLine(e))
	if err != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.out.Write(b)
	r.out.WriteByte('\n')
	r.Lines++
}

// EntryLine renders an access log entry as the shipped JSON line.
func EntryLine(e *accesslogdatav3.HTTPAccessLogEntry) map[string]any {
	cp := e.GetCommonProperties()
	line := map[string]any{
		"start_time":  strconv.FormatFloat(float64(cp.GetStartTime().AsTime().UnixNano())/1e9, 'f', 3, 64),
		"duration_ms": cp.GetDuration().AsDuration().Milliseconds(),
		"ttfb_ms":     cp.GetTimeToFirstUpstreamRxByte().AsDuration().Milliseconds(),
		"code":        e.GetResponse().GetResponseCode().GetValue(),
		"flags":       flagString(cp.GetResponseFlags()),
		"details":     e.GetResponse().GetResponseCodeDetails(),
		"cluster":     cp.GetUpstreamCluster(),
		"attempts":    cp.GetUpstreamRequestAttemptCount(),
	}
	if fb := cp.GetMetadata().GetFilterMetadata()["fusebox"]; fb != nil {
		m := fb.AsMap()
		line["fusebox"] = m
		// The gateway and route the shipped json_format takes from the
		// headers: the gRPC entry has them in fusebox's own metadata (the
		// headers only when the logger lists them). Before, a recorded
		// line had no gateway, and every entry replayed as "default".
		for _, k := range []string{"gateway", "route"} {
			if v, ok := m[k].(string); ok && v != "" {
				line[k] = v
			}
		}
	}
	if h := e.GetRequest().GetRequestHeaders()["x-fusebox-gateway"]; h != "" {
		line["gateway"] = h
	}
	if h := e.GetResponse().GetResponseHeaders()["x-fusebox-route"]; h != "" {
		line["route"] = h
	}
	return line
}

func flagString(f *accesslogdatav3.ResponseFlags) string {
	var out []string
	for _, b := range []struct {
		on   bool
		name string
	}{
		{f.GetNoHealthyUpstream(), "UH"}, {f.GetUpstreamRequestTimeout(), "UT"}, {f.GetLocalReset(), "LR"},
		{f.GetUpstreamRemoteReset(), "UR"}, {f.GetUpstreamConnectionFailure(), "UF"}, {f.GetUpstreamConnectionTermination(), "UC"},
		{f.GetUpstreamOverflow(), "UO"}, {f.GetNoRouteFound(), "NR"}, {f.GetDownstreamConnectionTermination(), "DC"}, {f.GetDownstreamRemoteReset(), "DR"},
		{f.GetUpstreamRetryLimitExceeded(), "URX"}, {f.GetNoClusterFound(), "NC"}, {f.GetUpstreamProtocolError(), "UPE"},
		{f.GetStreamIdleTimeout(), "SI"}, {f.GetUpstreamMaxStreamDurationReached(), "UMSDR"}, {f.GetDurationTimeout(), "DT"},
	} {
		if b.on {
			out = append(out, b.name)
		}
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}
