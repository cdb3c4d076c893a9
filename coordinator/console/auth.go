package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/fleetcheck/fleetcheck/coordinator/authz"
	"github.com/fleetcheck/fleetcheck/internal/pki"
)

// Identity kinds of console users.
const (
	viaCert      = "certificate"
	viaToken     = "token"
	viaAnonymous = "anonymous"
)

// who is the operator behind a request.
type who struct {
	ID  authz.Identity // what the campaign service audits (ActorFrom)
	Via string         // certificate, token or anonymous
	// csrf is the token a POST must carry.
	csrf string
	// session is the cookie's session id; "" without one.
	session string
}

// Actor names the operator as the audit log does.
func (w who) Actor() string { return w.ID.Actor() }

// tokenKind is the identity kind a token user audits as ("token:alice"):
// not a certificate kind, so it is never mistaken for one.
const tokenKind pki.Kind = "token"

const (
	sessionCookie = "fleetcheck_console"
	sessionTTL    = 12 * time.Hour
	maxSessions   = 10_000
)

// sessions are the logins made with a token: the cookie holds a random id,
// never the token.
type sessions struct {
	now func() time.Time
	key []byte // CSRF tokens of cookie-less identities are HMACs under it

	mu sync.Mutex
	m  map[string]*session
}

type session struct {
	name    string
	csrf    string
	expires time.Time
}

func newSessions(now func() time.Time) (*sessions, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	return &sessions{now: now, key: key, m: map[string]*session{}}, nil
}

func randomID() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on supported systems
	return hex.EncodeToString(b)
}

func (ss *sessions) create(name string) (id string, s *session) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	now := ss.now()
	if len(ss.m) >= maxSessions {
		for k, v := range ss.m {
			if now.After(v.expires) {
				delete(ss.m, k)
			}
		}
	}
	if len(ss.m) >= maxSessions {
		// Drop one: a flood of logins must not grow memory without bound.
		for k := range ss.m {
			delete(ss.m, k)
			break
		}
	}
	id = randomID()
	s = &session{name: name, csrf: randomID(), expires: now.Add(sessionTTL)}
	ss.m[id] = s
	return id, s
}

func (ss *sessions) get(id string) (*session, bool) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.m[id]
	if !ok {
		return nil, false
	}
	if ss.now().After(s.expires) {
		delete(ss.m, id)
		return nil, false
	}
	return s, true
}

func (ss *sessions) drop(id string) {
	ss.mu.Lock()
	delete(ss.m, id)
	ss.mu.Unlock()
}

// csrfFor is the CSRF token of an identity without a session (a
// certificate or anonymous): bound to the identity, unknown to other sites.
func (ss *sessions) csrfFor(actor string) string {
	m := hmac.New(sha256.New, ss.key)
	m.Write([]byte(actor))
	return hex.EncodeToString(m.Sum(nil))
}

var (
	errNoCredentials  = errors.New("no credentials: present an admin certificate or sign in with a token")
	errSessionToken   = errors.New("unknown or expired session")
	errTooManyGuesses = errors.New("too many wrong tokens from this host: try again in a minute")
)

// identify finds who is asking. A client certificate decides alone: a
// node's gets 403 whatever else the request carries.
func (s *Server) identify(r *http.Request) (who, int, error) {
	var addr net.Addr
	if a, err := net.ResolveTCPAddr("tcp", r.RemoteAddr); err == nil {
		addr = a
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		id, err := s.authz.AuthorizeOperator(r.TLS, addr)
		if err != nil {
			if errors.Is(err, authz.ErrUnauthenticated) {
				return who{}, http.StatusUnauthorized, err
			}
			return who{}, http.StatusForbidden, err
		}
		return who{ID: id, Via: viaCert, csrf: s.sess.csrfFor(id.Actor())}, 0, nil
	}
	if h := r.Header.Get("Authorization"); h != "" {
		tok, ok := strings.CutPrefix(h, "Bearer ")
		if !ok {
			return who{}, http.StatusUnauthorized, errors.New("authorization header: want Bearer TOKEN")
		}
		if s.guard.locked(r.RemoteAddr) {
			return who{}, http.StatusTooManyRequests, errTooManyGuesses
		}
		name, err := s.toks.lookup(strings.TrimSpace(tok))
		if err != nil {
			s.guard.failed(r.RemoteAddr)
			return who{}, http.StatusUnauthorized, err
		}
		return who{ID: tokenIdentity(name, r.RemoteAddr), Via: viaToken}, 0, nil
	}
	if c, err := r.Cookie(sessionCookie); err == nil {
		if ses, ok := s.sess.get(c.Value); ok {
			// A token taken out of the file ends its sessions too.
			if s.toks.has(ses.name) {
				return who{ID: tokenIdentity(ses.name, r.RemoteAddr), Via: viaToken, csrf: ses.csrf, session: c.Value}, 0, nil
			}
			s.sess.drop(c.Value)
		}
		if !s.opts.Insecure {
			return who{}, http.StatusUnauthorized, errSessionToken
		}
	}
	if s.opts.Insecure {
		id, _ := s.authz.AuthorizeOperator(nil, addr)
		return who{ID: id, Via: viaAnonymous, csrf: s.sess.csrfFor("anonymous")}, 0, nil
	}
	return who{}, http.StatusUnauthorized, errNoCredentials
}

func tokenIdentity(name, peer string) authz.Identity {
	return authz.Identity{Identity: pki.Identity{Kind: tokenKind, Name: name}, Peer: peer}
}

// has reports whether some token still names the operator.
func (t *tokens) has(name string) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	for _, n := range t.byHash {
		if n == name {
			return true
		}
	}
	return false
}

// sameOrigin refuses a state-changing request another site made the
// browser send: its Origin (or, without one, Referer) must be this host,
// and Sec-Fetch-Site, when the browser sends it, must not be cross-site.
func sameOrigin(r *http.Request) bool {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		o = r.Header.Get("Referer")
	}
	if o == "" {
		// Browsers send Origin on every POST; a client without one
		// (curl) is not a browser another site could drive.
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host
}

// checkCSRF says whether a POST carries the caller's CSRF token from this
// origin. A bearer token is sent by the client itself, never by a browser
// on another site's behalf, so it needs no CSRF token.
func checkCSRF(r *http.Request, w who) bool {
	if !sameOrigin(r) {
		return false
	}
	if w.Via == viaToken && w.session == "" {
		return true
	}
	got := r.PostFormValue("csrf")
	return w.csrf != "" && subtle.ConstantTimeCompare([]byte(got), []byte(w.csrf)) == 1
}

// withIdentity puts the operator in ctx as the authz interceptors would,
// so the campaign service audits the action under the operator's name.
func withIdentity(ctx context.Context, id who, s *Server) context.Context {
	return authz.WithIdentity(ctx, id.ID, s.log)
}

// Session says whether the operator signed in with a token (and may sign out).
func (w who) Session() bool { return w.session != "" }
