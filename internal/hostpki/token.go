package hostpki

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"log/slog"
	"strings"
	"sync"
	"time"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

// tokenPrefix versions the printed form of a join token.
const tokenPrefix = "corral1"

// JoinToken is what an operator hands a new host: the one-time secret and the
// pin of the CA the host should trust. Printed as corral1.<secret>.<pin>.
type JoinToken struct {
	Secret logging.Secret
	CAPin  string
}

// Reveal returns the printed form, secret included.
func (t JoinToken) Reveal() string {
	return tokenPrefix + "." + t.Secret.Reveal() + "." + t.CAPin
}

// LogValue implements slog.LogValuer: only the pin shows.
func (t JoinToken) LogValue() slog.Value {
	return slog.GroupValue(slog.String("secret", "[redacted]"), slog.String("ca_pin", t.CAPin))
}

// String implements fmt.Stringer without the secret.
func (t JoinToken) String() string { return tokenPrefix + ".[redacted]." + t.CAPin }

// ParseJoinToken parses the printed form.
func ParseJoinToken(s string) (JoinToken, error) {
	parts := strings.Split(strings.TrimSpace(s), ".")
	if len(parts) != 3 || parts[0] != tokenPrefix || parts[1] == "" || len(parts[2]) != 64 {
		return JoinToken{}, errdefs.InvalidArgument("join token: want %s.<secret>.<ca pin>, as `corral hostctl serve` prints it", tokenPrefix)
	}
	if _, err := hex.DecodeString(parts[2]); err != nil {
		return JoinToken{}, errdefs.InvalidArgument("join token: CA pin is not hex")
	}
	return JoinToken{Secret: logging.Secret(parts[1]), CAPin: parts[2]}, nil
}

// Tokens holds issued join tokens, hashed. Each works once, before it expires.
type Tokens struct {
	now func() time.Time

	// mu guards byHash.
	mu     sync.Mutex
	byHash map[[32]byte]*tokenEntry
}

type tokenEntry struct {
	expires time.Time
	used    bool
}

// NewTokens returns an empty token store; now is the clock (nil: time.Now).
func NewTokens(now func() time.Time) *Tokens {
	if now == nil {
		now = time.Now
	}
	return &Tokens{now: now, byHash: map[[32]byte]*tokenEntry{}}
}

// Issue makes a new token valid for ttl, for hosts that will trust ca.
func (t *Tokens) Issue(ca *CA, ttl time.Duration) (JoinToken, error) {
	tok, err := NewJoinToken(ca)
	if err != nil {
		return JoinToken{}, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.byHash[sha256.Sum256([]byte(tok.Secret.Reveal()))] = &tokenEntry{expires: t.now().Add(ttl)}
	return tok, nil
}

// NewJoinToken makes a fresh token for hosts that will trust ca; the caller
// stores its TokenHash.
func NewJoinToken(ca *CA) (JoinToken, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return JoinToken{}, err
	}
	return JoinToken{Secret: logging.Secret(base64.RawURLEncoding.EncodeToString(b)), CAPin: ca.Pin()}, nil
}

// TokenHash is the hex SHA-256 of a token's secret: what a token store keeps.
func TokenHash(secret logging.Secret) string {
	h := sha256.Sum256([]byte(secret.Reveal()))
	return hex.EncodeToString(h[:])
}

// Consume accepts a token's secret once. Unknown, used and expired tokens are
// errors of kind unauthenticated, saying which.
func (t *Tokens) Consume(secret logging.Secret) error {
	h := sha256.Sum256([]byte(secret.Reveal()))
	t.mu.Lock()
	defer t.mu.Unlock()
	var e *tokenEntry
	for k, v := range t.byHash {
		if subtle.ConstantTimeCompare(k[:], h[:]) == 1 {
			e = v
		}
	}
	switch {
	case e == nil:
		return errdefs.Unauthenticated("join token unknown")
	case e.used:
		return errdefs.Unauthenticated("join token already used")
	case !t.now().Before(e.expires):
		return errdefs.Unauthenticated("join token expired")
	}
	e.used = true
	return nil
}
