package classify

import "unicode"

// hasVisibleRune handles the non-ASCII tail of visibleText: Unicode spaces
// (U+00A0, U+3000, …) and zero-width characters are not an answer.
func hasVisibleRune(s string) bool {
	for _, r := range s {
		if unicode.IsSpace(r) || r == '\u200b' || r == '\u200c' || r == '\u200d' || r == '\ufeff' {
			continue
		}
		return true
	}
	return false
}
