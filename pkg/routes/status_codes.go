package routes

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	"go.yaml.in/yaml/v3"
)

// ParseStatusCodes applies R-P1 and R-P8 to the YAML/JSON node of a status-code
// list. It returns (nil, false, nil) for an unset list (`null`, `{}` or a
// missing node), the codes for a valid array, and an error naming what was
// wrong otherwise. The error text does not name the field; callers add it.
func ParseStatusCodes(n *yaml.Node) (codes []int, set bool, err error) {
	if n == nil {
		return nil, false, nil
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("must be an array of whole numbers in 100..599, got %s %q", scalarKind(n), n.Value)
	case yaml.MappingNode:
		if len(n.Content) == 0 {
			return nil, false, nil
		}
		return nil, false, fmt.Errorf("must be an array of whole numbers in 100..599, got a non-empty object")
	case yaml.SequenceNode:
		codes = make([]int, 0, len(n.Content))
		for i, e := range n.Content {
			c, err := wholeNumber(e)
			if err != nil {
				return nil, false, fmt.Errorf("element %d: %v", i, err)
			}
			if c < 100 || c > 599 {
				return nil, false, fmt.Errorf("element %d: %d is not an HTTP status in 100..599", i, c)
			}
			if c < 400 {
				// A breaker that counts a success or a redirect as a
				// failure is never meant (R-P1).
				return nil, false, fmt.Errorf("element %d: %d is below 400; only error statuses can count as failures", i, c)
			}
			if slices.Contains(codes, int(c)) {
				return nil, false, fmt.Errorf("element %d: %d is listed twice", i, c)
			}
			codes = append(codes, int(c))
		}
		return codes, true, nil
	default:
		return nil, false, fmt.Errorf("must be an array of whole numbers in 100..599")
	}
}

// wholeNumber reads a YAML/JSON number with no fractional part (R-P8): `500`
// and `500.0` both are; `"500"`, `5.5`, `true` and `[500]` are not.
func wholeNumber(n *yaml.Node) (int64, error) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.ScalarNode {
		return 0, fmt.Errorf("must be a whole number, got %s", nodeKind(n))
	}
	switch n.Tag {
	case "!!int":
		v, err := strconv.ParseInt(n.Value, 0, 64)
		if err != nil {
			var u uint64
			if u, err = strconv.ParseUint(n.Value, 0, 64); err != nil || u > math.MaxInt64 {
				return 0, fmt.Errorf("must be a whole number, got %q", n.Value)
			}
			v = int64(u)
		}
		return v, nil
	case "!!float":
		f, err := strconv.ParseFloat(n.Value, 64)
		if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
			return 0, fmt.Errorf("must be a whole number, got %s", n.Value)
		}
		return int64(f), nil
	default:
		return 0, fmt.Errorf("must be a whole number, got %s %q", scalarKind(n), n.Value)
	}
}

// number reads any finite YAML/JSON number.
func number(n *yaml.Node) (float64, error) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.ScalarNode || (n.Tag != "!!int" && n.Tag != "!!float") {
		if n.Kind == yaml.ScalarNode {
			return 0, fmt.Errorf("must be a number, got %s %q", scalarKind(n), n.Value)
		}
		return 0, fmt.Errorf("must be a number, got %s", nodeKind(n))
	}
	f, err := strconv.ParseFloat(n.Value, 64)
	if err != nil {
		if v, ierr := strconv.ParseInt(n.Value, 0, 64); ierr == nil {
			return float64(v), nil
		}
		return 0, fmt.Errorf("must be a number, got %q", n.Value)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0, fmt.Errorf("must be a finite number, got %s", n.Value)
	}
	return f, nil
}

func scalarKind(n *yaml.Node) string { return tagKind(n.Tag) }

// tagKind names what a YAML tag holds, in the operator's words.
func tagKind(tag string) string {
	switch tag {
	case "!!str":
		return "a string"
	case "!!int", "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "null"
	}
	return "a scalar"
}

func nodeKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		return scalarKind(n)
	case yaml.SequenceNode:
		return "an array"
	case yaml.MappingNode:
		return "an object"
	}
	return "something else"
}
