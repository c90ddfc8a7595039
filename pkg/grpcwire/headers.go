package grpcwire

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// parseTimeout reads a grpc-timeout value: at most 8 digits and a unit
// (gRPC over HTTP/2, "Timeout").
func parseTimeout(v string) (time.Duration, error) {
	if len(v) < 2 || len(v) > 9 {
		return 0, fmt.Errorf("grpc-timeout %q: malformed", v)
	}
	n, err := strconv.ParseUint(v[:len(v)-1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("grpc-timeout %q: malformed", v)
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, fmt.Errorf("grpc-timeout %q: unknown unit", v)
	}
	// 8 digits of hours fit in a Duration only up to about 2.5 M hours.
	if d := time.Duration(n); d > (1<<63-1)/unit {
		return 1<<63 - 1, nil
	}
	return time.Duration(n) * unit, nil
}

// decodeMetadataValue decodes a binary (-bin) header's base64, padded or
// not, as grpc-go does; other values pass as they are.
func decodeMetadataValue(k, v string) (string, error) {
	if !strings.HasSuffix(k, "-bin") {
		return v, nil
	}
	enc := base64.RawStdEncoding
	if len(v)%4 == 0 {
		enc = base64.StdEncoding
	}
	b, err := enc.DecodeString(v)
	if err != nil {
		return "", fmt.Errorf("metadata %s: %v", k, err)
	}
	return string(b), nil
}

func appendMetadata(hs []hpack.HeaderField, md metadata.MD) []hpack.HeaderField {
	for k, vs := range md {
		if k == "" || k[0] == ':' {
			continue
		}
		for _, v := range vs {
			if strings.HasSuffix(k, "-bin") {
				v = base64.RawStdEncoding.EncodeToString([]byte(v))
			}
			hs = append(hs, hpack.HeaderField{Name: k, Value: v})
		}
	}
	return hs
}

// appendStatus adds grpc-status, grpc-message (percent-encoded) and the
// details, if any.
func appendStatus(hs []hpack.HeaderField, s *status.Status) []hpack.HeaderField {
	hs = append(hs, hpack.HeaderField{Name: "grpc-status", Value: strconv.Itoa(int(s.Code()))})
	if m := s.Message(); m != "" {
		hs = append(hs, hpack.HeaderField{Name: "grpc-message", Value: encodeGRPCMessage(m)})
	}
	if p := s.Proto(); len(p.GetDetails()) > 0 {
		if b, err := proto.Marshal(p); err == nil {
			hs = append(hs, hpack.HeaderField{Name: "grpc-status-details-bin", Value: base64.RawStdEncoding.EncodeToString(b)})
		}
	}
	return hs
}

// encodeGRPCMessage percent-encodes what is not printable ASCII, and '%'.
func encodeGRPCMessage(m string) string {
	clean := true
	for i := 0; i < len(m); i++ {
		if c := m[i]; c < ' ' || c > '~' || c == '%' {
			clean = false
			break
		}
	}
	if clean {
		return m
	}
	var b strings.Builder
	for i := 0; i < len(m); i++ {
		c := m[i]
		if c < ' ' || c > '~' || c == '%' {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
