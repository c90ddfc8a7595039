package routes

import "fmt"

// Bounds of an admin JSON body, checked before it is decoded (R-L13): a
// 60 KB body nested 10,000 deep cost seconds of CPU and hundreds of MB in
// the decoder and the merge, under the config lock.
const (
	MaxJSONDepth    = 64
	MaxJSONElements = 10000
)

// JSONBoundsError is a body over MaxJSONDepth or MaxJSONElements.
type JSONBoundsError struct{ Problem string }

func (e *JSONBoundsError) Error() string { return "body: " + e.Problem }

// CheckJSONBounds scans b once, without decoding it, for the nesting depth
// of objects and arrays and the number of elements (array items and object
// members). In valid JSON every element but a container's first follows a
// comma, so elements are the commas outside strings plus one per non-empty
// container. Malformed JSON is left to the decoder: only the bounds are
// judged here.
func CheckJSONBounds(b []byte) error {
	depth, elements := 0, 0
	inString, escaped, opened := false, false, false
	for _, c := range b {
		if inString {
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
			continue
		}
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			continue
		}
		if opened && c != ']' && c != '}' {
			elements++ // the first element of the container just opened
		}
		opened = false
		switch c {
		case '"':
			inString = true
		case '[', '{':
			depth++
			opened = true
			if depth > MaxJSONDepth {
				return &JSONBoundsError{Problem: fmt.Sprintf("nested deeper than %d levels", MaxJSONDepth)}
			}
		case ']', '}':
			depth--
		case ',':
			elements++
		}
		if elements > MaxJSONElements {
			return &JSONBoundsError{Problem: fmt.Sprintf("more than %d elements", MaxJSONElements)}
		}
	}
	return nil
}
