package egress

import "crypto/tls"

// Leaf mints a certificate for name: the gVisor tests' upstream servers
// use a CA of their own made with NewCA.
func (ca *CA) Leaf(name string) (*tls.Certificate, error) { return ca.leaf(name) }
