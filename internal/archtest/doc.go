// Package archtest tests the shape of the code base: every package documents
// itself, and imports point the way ../shared/STYLE.md draws them. It has no
// code of its own.
package archtest
