// Package seal encrypts the control plane's secrets at rest: private keys
// that Raft replicates (the hosts' and the nodes' CA keys) and a node's own
// key in its data directory. A key-encryption key (KEK) from the seal key
// file encrypts them with AES-256-GCM before they reach a Raft command, so
// neither the Raft log nor its snapshots hold a usable key.
//
// The seal key file is a keyring: one key per line, 64 hex digits (256
// bits); lines starting with '#' are comments. The first key seals; every
// key opens. A key's id is derived from the key (the first 8 bytes of its
// SHA-256, hex) and travels in every envelope, so rotation works: put the
// new key first, keep the old one below it while secrets are resealed, then
// drop it.
//
//	Sealed{key_id, nonce, data} = AES-256-GCM(KEK[key_id], nonce, plaintext, aad = purpose)
//
// The purpose ("host-ca-key", "node-ca-key", ...) is the additional data:
// an envelope opens only as the secret it was sealed as.
package seal

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/hostpki"
)

// KeyBytes is the size of a key-encryption key (AES-256).
const KeyBytes = 32

// maxKeyFileBytes bounds the seal key file read.
const maxKeyFileBytes = 64 << 10

// ErrWrongKey is wrapped by every failure to open an envelope with the
// keyring at hand: its key id is not in the file, or the key does not
// authenticate the data.
var ErrWrongKey = errors.New("wrong seal key")

// Sealed is an encrypted secret: the envelope that Raft commands, snapshots
// and files carry instead of the secret.
type Sealed struct {
	KeyID string `json:"key_id"`
	Nonce []byte `json:"nonce"`
	Data  []byte `json:"data"` // ciphertext and GCM tag
}

// IsZero reports whether s holds nothing.
func (s Sealed) IsZero() bool { return s.KeyID == "" && len(s.Data) == 0 }

type key struct {
	id   string
	aead cipher.AEAD
}

// Keyring holds the keys of a seal key file.
type Keyring struct {
	path string

	// mu guards keys (first: the sealing key).
	mu   sync.RWMutex
	keys []key
}

// Load reads the keyring at path. A missing file, a file without keys and
// a malformed line are errors naming the file.
func Load(path string) (*Keyring, error) {
	k := &Keyring{path: path}
	if err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Path is the seal key file the keyring was read from.
func (k *Keyring) Path() string { return k.path }

// Reload reads the file again (a key added to it on a running node).
func (k *Keyring) Reload() error {
	keys, err := readKeys(k.path)
	if err != nil {
		return err
	}
	k.mu.Lock()
	k.keys = keys
	k.mu.Unlock()
	return nil
}

// CurrentID is the id of the key that seals.
func (k *Keyring) CurrentID() string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.keys[0].id
}

// IDs lists the keyring's key ids, the sealing key first.
func (k *Keyring) IDs() []string {
	k.mu.RLock()
	defer k.mu.RUnlock()
	out := make([]string, len(k.keys))
	for i, kk := range k.keys {
		out[i] = kk.id
	}
	return out
}

// Seal encrypts plaintext as purpose under the current key.
func (k *Keyring) Seal(purpose string, plaintext []byte) (Sealed, error) {
	k.mu.RLock()
	cur := k.keys[0]
	k.mu.RUnlock()
	nonce := make([]byte, cur.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return Sealed{}, err
	}
	return Sealed{KeyID: cur.id, Nonce: nonce, Data: cur.aead.Seal(nil, nonce, plaintext, []byte(purpose))}, nil
}

// Open decrypts s, sealed as purpose. An envelope under a key id the
// keyring lacks makes it read the file again once (the operator may have
// added the key since). Failures wrap ErrWrongKey and name the key ids,
// never a key.
func (k *Keyring) Open(purpose string, s Sealed) ([]byte, error) {
	if s.IsZero() {
		return nil, errdefs.InvalidArgument("no sealed %s", purpose)
	}
	kk, ok := k.find(s.KeyID)
	if !ok {
		if err := k.Reload(); err != nil {
			return nil, err
		}
		if kk, ok = k.find(s.KeyID); !ok {
			return nil, wrongKey("the %s is sealed under key %s and %s holds only %s", purpose, s.KeyID, k.path, strings.Join(k.IDs(), ", "))
		}
	}
	if len(s.Nonce) != kk.aead.NonceSize() {
		return nil, wrongKey("the sealed %s has a bad nonce", purpose)
	}
	out, err := kk.aead.Open(nil, s.Nonce, s.Data, []byte(purpose))
	if err != nil {
		return nil, wrongKey("key %s does not open the sealed %s", s.KeyID, purpose)
	}
	return out, nil
}

// wrongKey is a failed precondition reading "wrong seal key: <detail>".
func wrongKey(format string, args ...any) error {
	return &errdefs.Error{Kind: errdefs.FailedPreconditionKind, Err: fmt.Errorf("%w: "+format, append([]any{ErrWrongKey}, args...)...)}
}

func (k *Keyring) find(id string) (key, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	for _, kk := range k.keys {
		if kk.id == id {
			return kk, true
		}
	}
	return key{}, false
}

func newKey(raw []byte) (key, error) {
	block, err := aes.NewCipher(raw)
	if err != nil {
		return key{}, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return key{}, err
	}
	sum := sha256.Sum256(raw)
	return key{id: hex.EncodeToString(sum[:8]), aead: aead}, nil
}

func readKeys(path string) ([]key, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading the seal key file: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > maxKeyFileBytes {
		return nil, errdefs.InvalidArgument("seal key file %s: larger than %d bytes", path, maxKeyFileBytes)
	}
	var keys []key
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		raw, err := hex.DecodeString(s)
		if err != nil || len(raw) != KeyBytes {
			return nil, errdefs.InvalidArgument("seal key file %s, line %d: want %d hex digits", path, line, 2*KeyBytes)
		}
		kk, err := newKey(raw)
		if err != nil {
			return nil, err
		}
		keys = append(keys, kk)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the seal key file: %w", err)
	}
	if len(keys) == 0 {
		return nil, errdefs.InvalidArgument("seal key file %s holds no key", path)
	}
	return keys, nil
}

// NewKeyLine returns a fresh key as a keyring line, and its id.
func NewKeyLine() (line, id string, err error) {
	raw := make([]byte, KeyBytes)
	if _, err := rand.Read(raw); err != nil {
		return "", "", err
	}
	kk, err := newKey(raw)
	if err != nil {
		return "", "", err
	}
	return hex.EncodeToString(raw), kk.id, nil
}

// Create writes a new seal key file at path (mode 0600) holding one fresh
// key, and returns its id. An existing file is an error of kind already
// exists.
func Create(path string) (string, error) {
	line, id, err := NewKeyLine()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) {
			return "", errdefs.AlreadyExists("seal key file %s", path)
		}
		return "", err
	}
	if _, err := fmt.Fprintf(f, "# corral seal keys: the first seals, all open\n%s\n", line); err != nil {
		f.Close()
		return "", err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return "", err
	}
	return id, f.Close()
}

// AddKey puts a fresh key first in the keyring file at path (creating the
// file when absent), keeping the others below it to open what they sealed;
// it returns the new key's id. The file is replaced atomically, mode 0600.
func AddKey(path string) (string, error) {
	old, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Create(path)
	}
	if err != nil {
		return "", err
	}
	if _, err := readKeys(path); err != nil {
		return "", err
	}
	line, id, err := NewKeyLine()
	if err != nil {
		return "", err
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n", line)
	b.Write(old)
	return id, hostpki.WriteFileAtomic(path, b.Bytes(), 0o600)
}
