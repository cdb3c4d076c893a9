package pki

import (
	"bytes"
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// File names in a CA directory and in an issued certificate's directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// ErrExists is returned when writing would replace a key or certificate
// already on disk and the caller did not ask to overwrite.
var ErrExists = errors.New("already exists")

// LeafFiles are the names of a leaf's certificate and key inside a
// directory: KIND-NAME.crt and KIND-NAME.key, so a node and an operator of
// the same name do not collide.
func LeafFiles(dir string, id Identity) (certFile, keyFile string) {
	base := string(id.Kind) + "-" + id.Name
	return filepath.Join(dir, base+".crt"), filepath.Join(dir, base+".key")
}

// EncodeCert is the PEM form of a certificate.
func EncodeCert(cert *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
}

// EncodeKey is the PEM form (PKCS #8) of a private key.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("encode private key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseCertsPEM reads every certificate in a PEM bundle, refusing one
// that holds none so that a wrong file is not taken for an empty trust.
func ParseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse certificate: %w", err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no PEM certificate found")
	}
	return certs, nil
}

// ParseKeyPEM reads the first private key in PEM data: PKCS #8, SEC 1
// ("EC PRIVATE KEY") or PKCS #1 ("RSA PRIVATE KEY"), as other PKIs write.
func ParseKeyPEM(data []byte) (crypto.Signer, error) {
	for {
		var b *pem.Block
		b, data = pem.Decode(data)
		if b == nil {
			return nil, errors.New("no PEM private key found")
		}
		var (
			k   any
			err error
		)
		switch b.Type {
		case "PRIVATE KEY":
			k, err = x509.ParsePKCS8PrivateKey(b.Bytes)
		case "EC PRIVATE KEY":
			k, err = x509.ParseECPrivateKey(b.Bytes)
		case "RSA PRIVATE KEY":
			k, err = x509.ParsePKCS1PrivateKey(b.Bytes)
		default:
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("parse private key: %w", err)
		}
		s, ok := k.(crypto.Signer)
		if !ok {
			return nil, fmt.Errorf("private key of type %T cannot sign", k)
		}
		return s, nil
	}
}

// WriteCA writes ca.crt (0644) and ca.key (0600) into dir, creating dir
// (0700) if needed. It refuses to replace either file unless force is set.
func WriteCA(dir string, ca *CA, force bool) (certFile, keyFile string, err error) {
	certFile, keyFile = filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	keyPEM, err := EncodeKey(ca.Key)
	if err != nil {
		return "", "", err
	}
	if err := writePair(dir, certFile, EncodeCert(ca.Cert), keyFile, keyPEM, force); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// WriteLeaf writes KIND-NAME.crt (0644) and KIND-NAME.key (0600) into dir,
// creating dir (0700) if needed. It refuses to replace either file unless
// force is set.
func WriteLeaf(dir string, leaf *Leaf, force bool) (certFile, keyFile string, err error) {
	certFile, keyFile = LeafFiles(dir, leaf.Identity)
	keyPEM, err := EncodeKey(leaf.Key)
	if err != nil {
		return "", "", err
	}
	if err := writePair(dir, certFile, EncodeCert(leaf.Cert), keyFile, keyPEM, force); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// WriteCACert copies a CA certificate into dir (next to issued leaves, so a
// node's directory holds all it needs). The same certificate already there
// is left alone; a different one is replaced only with force, since that
// changes what the holder trusts.
func WriteCACert(dir string, cert *x509.Certificate, force bool) (string, error) {
	path := filepath.Join(dir, CACertFile)
	data := EncodeCert(cert)
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, data):
		return path, nil
	case err == nil && !force:
		return "", fmt.Errorf("%w: %s holds another CA certificate (use --force to replace it)", ErrExists, path)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("read %s: %w", path, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("create %s: %w", dir, err)
	}
	if err := writeAtomic(path, data, 0o644); err != nil {
		return "", err
	}
	return path, nil
}

// LoadCA reads ca.crt and ca.key from dir. trustDomain may be empty when
// the certificate records its domain (fleetcheck's CAs do); given, it must
// agree with the one recorded.
func LoadCA(dir, trustDomain string) (*CA, error) {
	certPEM, err := os.ReadFile(filepath.Join(dir, CACertFile))
	if err != nil {
		return nil, fmt.Errorf("read ca certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(dir, CAKeyFile))
	if err != nil {
		return nil, fmt.Errorf("read ca key: %w", err)
	}
	certs, err := ParseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, CACertFile), err)
	}
	cert := certs[0]
	if !cert.IsCA {
		return nil, fmt.Errorf("%s is not a CA certificate", filepath.Join(dir, CACertFile))
	}
	key, err := ParseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, CAKeyFile), err)
	}
	if !publicKeysEqual(cert.PublicKey, key.Public()) {
		return nil, fmt.Errorf("%s does not match %s", CAKeyFile, CACertFile)
	}
	recorded, recErr := CATrustDomain(cert)
	switch {
	case trustDomain == "" && recErr != nil:
		return nil, fmt.Errorf("%w; give the trust domain explicitly", recErr)
	case trustDomain == "":
		trustDomain = recorded
	case recErr == nil && recorded != trustDomain:
		return nil, fmt.Errorf("ca certificate is for trust domain %q, not %q", recorded, trustDomain)
	}
	if err := ValidateTrustDomain(trustDomain); err != nil {
		return nil, err
	}
	return &CA{Cert: cert, Key: key, TrustDomain: trustDomain}, nil
}

func publicKeysEqual(a, b crypto.PublicKey) bool {
	ak, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ak.Equal(b)
}

// writePair writes a certificate and its key. Both are checked before
// either is written, so a refusal leaves nothing half done.
func writePair(dir, certFile string, certPEM []byte, keyFile string, keyPEM []byte, force bool) error {
	if !force {
		for _, p := range []string{keyFile, certFile} {
			if _, err := os.Lstat(p); err == nil {
				return fmt.Errorf("%w: %s (use --force to replace it)", ErrExists, p)
			} else if !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("stat %s: %w", p, err)
			}
		}
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	// Key first: a reloader that sees the new certificate before its key
	// fails the pair check and keeps the old pair until both are there.
	if err := writeAtomic(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	return writeAtomic(certFile, certPEM, 0o644)
}

// writeAtomic writes data to a temporary file beside path and renames it
// into place, so a reader never sees half a file. The mode is set on the
// temporary file before any data reaches it.
func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	cleanup := func(err error) error {
		_ = f.Close()
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Chmod(mode); err != nil {
		return cleanup(err)
	}
	if _, err := f.Write(data); err != nil {
		return cleanup(err)
	}
	if err := f.Sync(); err != nil {
		return cleanup(err)
	}
	if err := f.Close(); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
