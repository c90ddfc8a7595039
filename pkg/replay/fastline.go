package replay

import "strconv"

// The access log lines Envoy writes with the shipped json_format are flat
// objects of plain ASCII strings, numbers and nulls, with fusebox's
// metadata as one flat object inside. Reading them with encoding/json was
// two thirds of replay's time (reflection, a validation pass, a copy of
// every raw value), so fastLine reads that shape directly and answers
// exactly what encoding/json would into rawLine. Anything outside it — an
// escape or a byte past ASCII in a string, a key with an upper-case letter
// (encoding/json matches keys without regard to case), an array, a value
// nested deeper, a value of the wrong type for its field — is not guessed
// at: ok is false and ParseLine asks encoding/json, the reference
// (FuzzFastLineIsEncodingJSON holds the two together).

// lineScan walks one line.
type lineScan struct {
	b []byte
	i int
}

func (s *lineScan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next skips white space and says whether c is next (and takes it).
func (s *lineScan) next(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// str reads a string with no escapes, control or non-ASCII bytes, and
// returns what is between the quotes.
func (s *lineScan) str() ([]byte, bool) {
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	start := s.i + 1
	for j := start; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			s.i = j + 1
			return s.b[start:j], true
		case c == '\\' || c < 0x20 || c >= 0x80:
			return nil, false
		}
	}
	return nil, false
}

// key reads an object key that encoding/json would match only exactly.
func (s *lineScan) key() ([]byte, bool) {
	k, ok := s.str()
	if !ok {
		return nil, false
	}
	for _, c := range k {
		if c >= 'A' && c <= 'Z' {
			return nil, false
		}
	}
	return k, s.next(':')
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// num reads a number by JSON's grammar.
func (s *lineScan) num() bool {
	b, i := s.b, s.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return false
		}
		i = j
	}
	s.i = i
	return true
}

func (s *lineScan) word(w string) bool {
	if len(s.b)-s.i >= len(w) && string(s.b[s.i:s.i+len(w)]) == w {
		s.i += len(w)
		return true
	}
	return false
}

// Kinds of value scalar reads.
const (
	valString = iota + 1
	valNumber
	valNull
	valBool
)

// scalar reads a string, number, null, true or false and returns its kind
// (0: none of them).
func (s *lineScan) scalar() int {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	switch c := s.b[s.i]; {
	case c == '"':
		if _, ok := s.str(); ok {
			return valString
		}
	case c == '-' || c >= '0' && c <= '9':
		if s.num() {
			return valNumber
		}
	case c == 'n':
		if s.word("null") {
			return valNull
		}
	case c == 't':
		if s.word("true") {
			return valBool
		}
	case c == 'f':
		if s.word("false") {
			return valBool
		}
	}
	return 0
}

// flat reads an object of scalars, calling field with each key, the
// value's kind and its raw bytes; field returns false to give up.
func (s *lineScan) flat(field func(k []byte, kind int, v []byte) bool) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	for {
		s.ws()
		k, ok := s.key()
		if !ok {
			return false
		}
		s.ws()
		start := s.i
		kind := s.scalar()
		if kind == 0 || !field(k, kind, s.b[start:s.i]) {
			return false
		}
		if s.next('}') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// end says whether only white space is left.
func (s *lineScan) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// strField sets a string field as encoding/json does: a string is taken,
// null leaves it as it was, anything else is a type error (false).
func strField(dst *string, kind int, v []byte) bool {
	switch kind {
	case valString:
		*dst = string(v[1 : len(v)-1])
		return true
	case valNull:
		return true
	}
	return false
}

// fastLine reads a line of the common shape into what encoding/json would
// make of it, and fusebox's metadata object in the same pass (fb: the
// last "fusebox" object's, as encoding/json keeps the last); false: ask
// encoding/json.
func fastLine(b []byte) (raw rawLine, fb rawFusebox, ok bool) {
	s := lineScan{b: b}
	if !s.next('{') {
		return raw, fb, false
	}
	if s.next('}') {
		return raw, fb, s.end()
	}
	for {
		s.ws()
		k, ok := s.key()
		if !ok {
			return raw, fb, false
		}
		s.ws()
		start := s.i
		var kind int
		switch {
		case s.i < len(b) && b[s.i] == '{' && string(k) == "fusebox":
			fb = rawFusebox{}
			ok = s.fusebox(&fb)
		case s.i < len(b) && b[s.i] == '{':
			// Only fusebox's metadata is an object; another is skipped.
			ok = s.flat(func([]byte, int, []byte) bool { return true })
		default:
			kind = s.scalar()
			ok = kind != 0
		}
		if !ok {
			return raw, fb, false
		}
		v := b[start:s.i]
		// A json.RawMessage field takes any value's bytes (null too).
		switch string(k) {
		case "start_time":
			raw.StartTime = v
		case "duration_ms":
			raw.DurationMs = v
		case "ttfb_ms":
			raw.TTFBMs = v
		case "code":
			raw.Code = v
		case "attempts":
			raw.Attempts = v
		case "fusebox":
			raw.Fusebox = v
		case "ratelimit_requests":
			raw.RLReq = v
		case "ratelimit_requests_reset":
			raw.RLReqReset = v
		case "ratelimit_tokens":
			raw.RLTok = v
		case "ratelimit_tokens_reset":
			raw.RLTokReset = v
		case "flags":
			ok = strField(&raw.Flags, kind, v)
		case "details":
			ok = strField(&raw.Details, kind, v)
		case "cluster":
			ok = strField(&raw.Cluster, kind, v)
		case "gateway":
			ok = strField(&raw.Gateway, kind, v)
		case "route":
			ok = strField(&raw.Route, kind, v)
		}
		if !ok {
			return raw, fb, false
		}
		if s.next('}') {
			return raw, fb, s.end()
		}
		if !s.next(',') {
			return raw, fb, false
		}
	}
}

// fastFusebox reads fusebox's metadata object as encoding/json would into
// rawFusebox; false: ask encoding/json.
func fastFusebox(b []byte) (rawFusebox, bool) {
	var fb rawFusebox
	s := lineScan{b: b}
	return fb, s.fusebox(&fb) && s.end()
}

// fusebox reads fusebox's metadata object into fb.
func (s *lineScan) fusebox(fb *rawFusebox) bool {
	return s.flat(func(k []byte, kind int, v []byte) bool {
		switch string(k) {
		case "model":
			return strField(&fb.Model, kind, v)
		case "decision":
			return strField(&fb.Decision, kind, v)
		case "action":
			return strField(&fb.Action, kind, v)
		case "outcome":
			return strField(&fb.Outcome, kind, v)
		case "reason":
			return strField(&fb.Reason, kind, v)
		case "gateway":
			return strField(&fb.Gateway, kind, v)
		case "route":
			return strField(&fb.Route, kind, v)
		case "tokens_in":
			return numField(&fb.In, kind, v)
		case "tokens_out":
			return numField(&fb.Out, kind, v)
		case "replica":
			return strField(&fb.Replica, kind, v)
		case "fp":
			return strField(&fb.FP, kind, v)
		case "again":
			return boolField(&fb.Again, kind, v)
		}
		return true
	})
}

// boolField sets a bool field as encoding/json does (null leaves it).
func boolField(dst *bool, kind int, v []byte) bool {
	switch kind {
	case valBool:
		*dst = string(v) == "true"
		return true
	case valNull:
		return true
	}
	return false
}

// numField sets a float64 field as encoding/json does (null leaves it).
func numField(dst *float64, kind int, v []byte) bool {
	switch kind {
	case valNumber:
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil {
			return false
		}
		*dst = f
		return true
	case valNull:
		return true
	}
	return false
}
