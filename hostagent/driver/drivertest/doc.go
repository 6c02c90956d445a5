// Package drivertest is the one conformance suite every driver.Driver passes
// (Run), and Fake, an in-process driver for unit tests of the packages that
// use a driver.
//
// The suite's commands are POSIX sh scripts, exported as Script* constants so
// that the Fake, which runs no shell, can implement each of them in Go; a real
// driver runs them with sh -c.
package drivertest
