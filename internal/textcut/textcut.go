// Package textcut cuts strings to a byte bound without splitting a UTF-8
// character: what the host, the loop and the tools do to every text they
// bound before it goes out.
package textcut

import "unicode/utf8"

// Prefix is the longest prefix of s of at most n bytes that ends on a
// character boundary (s itself when it fits).
func Prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	if n < 0 {
		return ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
