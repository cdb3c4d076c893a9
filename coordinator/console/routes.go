package console

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/fleetcheck/fleetcheck/coordinator/store"
)

// liveHeader marks the page script's polls: the answer is the page's live
// part only.
const liveHeader = "X-Console-Live"

func (s *Server) routes() {
	m := http.NewServeMux()                 // behind refuseNonOperators
	static, _ := fs.Sub(staticFS, "static") // the embedded folder exists
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /login", s.loginPage)
	m.HandleFunc("POST /login", s.login)
	m.Handle("POST /logout", s.auth(s.logout))
	m.Handle("GET /{$}", http.RedirectHandler("/fleet", http.StatusFound))
	m.Handle("GET /fleet", s.auth(s.fleet))
	m.Handle("GET /nodes/{name}", s.auth(s.node))
	m.Handle("GET /campaigns", s.auth(s.campaigns))
	m.Handle("GET /campaigns/{kind}/{id}", s.auth(s.campaign))
	m.Handle("GET /campaigns/burnin/{id}/report.html", s.auth(s.burninReport))
	m.Handle("POST /campaigns/{kind}/{id}/{action}", s.auth(s.control))
	m.Handle("GET /remediations", s.auth(s.remediations))
	m.Handle("GET /remediations/{id}", s.auth(s.remediationPage))
	m.Handle("POST /remediations/{id}/{action}", s.auth(s.remediationControl))
	m.Handle("GET /events", s.auth(s.events))
	s.mux = http.NewServeMux()
	s.mux.Handle("/", s.refuseNonOperators(m))
}

// refuseNonOperators answers 403 to a client certificate that is not an
// operator's, on every path (sign-in page and assets too): a node gets
// nothing from the console.
func (s *Server) refuseNonOperators(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			if _, code, err := s.identify(r); err != nil {
				secureHeaders(w)
				http.Error(w, http.StatusText(code)+": "+err.Error(), code)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// auth runs h for an operator; anyone else gets 401 (a sign-in page) or 403.
func (s *Server) auth(h func(http.ResponseWriter, *http.Request, who) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		secureHeaders(w)
		id, code, err := s.identify(r)
		if err != nil {
			if code == http.StatusUnauthorized && r.Method == http.MethodGet && r.Header.Get(liveHeader) == "" {
				w.WriteHeader(code)
				s.render(w, r, "login", "Sign in", loginView{Next: r.URL.RequestURI(), Error: err.Error()}, who{})
				return
			}
			http.Error(w, http.StatusText(code)+": "+err.Error(), code)
			return
		}
		if err := h(w, r, id); err != nil {
			s.fail(w, r, id, err)
		}
	})
}

// secureHeaders keep the pages to themselves: nothing loaded from
// elsewhere, not framed, no guessing of types.
func secureHeaders(w http.ResponseWriter) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
}

// httpError is an error with the status it answers with.
type httpError struct {
	code int
	err  error
}

func (e *httpError) Error() string { return e.err.Error() }
func (e *httpError) Unwrap() error { return e.err }

func badRequest(format string, a ...any) error {
	return &httpError{code: http.StatusBadRequest, err: fmt.Errorf(format, a...)}
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, id who, err error) {
	code := http.StatusInternalServerError
	var he *httpError
	switch {
	case errors.As(err, &he):
		code = he.code
	case errors.Is(err, store.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, store.ErrInvalid):
		code = http.StatusBadRequest
	}
	if code == http.StatusInternalServerError {
		s.log.Error().Err(err).Str("path", r.URL.Path).Msg("console page")
	}
	w.WriteHeader(code)
	s.render(w, r, "error", http.StatusText(code), errorView{Code: code, Message: err.Error()}, id)
}

// page is what the layout needs around a page's own view.
type page struct {
	Title   string
	Nav     string
	Who     who
	CSRF    string
	Actions bool
	Refresh int64 // milliseconds; 0: the page does not update itself
	Version string
	Now     time.Time
	View    any
}

// pages holds one template set per page, each with the layout.
type pages struct {
	sets map[string]*template.Template
}

var funcs = template.FuncMap{
	"ago":    ago,
	"add":    func(a, b int) int { return a + b },
	"first":  func(n int, xs []string) []string { return xs[:min(n, len(xs))] },
	"stamp":  stamp,
	"q":      query,
	"pct":    func(a, b int) int { return int(float64(a) * 100 / float64(max(b, 1))) },
	"lower":  strings.ToLower,
	"join":   strings.Join,
	"path":   url.PathEscape,
	"num":    num,
	"secs":   secs,
	"has":    func(xs []string, x string) bool { return contains(xs, x) },
	"states": func() []string { return states },
}

func loadPages() (*pages, error) {
	p := &pages{sets: map[string]*template.Template{}}
	for _, name := range []string{"fleet", "node", "campaigns", "campaign", "remediations", "remediation", "events", "login", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(pagesFS, "web/layout.html", "web/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("page %s: %w", name, err)
		}
		p.sets[name] = t
	}
	return p, nil
}

// render writes a page, or only its live part when the page script asks.
// Polls carry an ETag: an unchanged part costs no body.
func (s *Server) render(w http.ResponseWriter, r *http.Request, name, title string, view any, id who) {
	t := s.pages.sets[name]
	pg := page{Title: title, Nav: name, Who: id, CSRF: id.csrf, Actions: s.cfg.Actions && id.Via != "",
		Version: s.opts.Version, Now: s.opts.Now(), View: view}
	if name != "login" && name != "error" {
		pg.Refresh = s.cfg.Refresh.Milliseconds()
	}
	var buf bytes.Buffer
	tmpl := "layout.html"
	if r.Header.Get(liveHeader) != "" {
		tmpl = "live"
	}
	if err := t.ExecuteTemplate(&buf, tmpl, pg); err != nil {
		s.log.Error().Err(err).Str("page", name).Msg("console render")
		http.Error(w, "render: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	if tmpl == "live" {
		sum := sha256.Sum256(buf.Bytes())
		etag := `"` + hex.EncodeToString(sum[:12]) + `"`
		h.Set("ETag", etag)
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	_, _ = w.Write(buf.Bytes()) // a client gone away is not an error here
}

type errorView struct {
	Code    int
	Message string
}

type loginView struct {
	Next  string
	Error string
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	secureHeaders(w)
	s.render(w, r, "login", "Sign in", loginView{Next: safeNext(r.URL.Query().Get("next"))}, who{})
}

// login trades a token for a session cookie.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	secureHeaders(w)
	if !sameOrigin(r) {
		http.Error(w, "Forbidden: cross-origin sign-in", http.StatusForbidden)
		return
	}
	next := safeNext(r.PostFormValue("next"))
	if s.guard.locked(r.RemoteAddr) {
		w.WriteHeader(http.StatusTooManyRequests)
		s.render(w, r, "login", "Sign in", loginView{Next: next, Error: errTooManyGuesses.Error()}, who{})
		return
	}
	name, err := s.toks.lookup(strings.TrimSpace(r.PostFormValue("token")))
	if err != nil {
		s.guard.failed(r.RemoteAddr)
		w.WriteHeader(http.StatusUnauthorized)
		s.render(w, r, "login", "Sign in", loginView{Next: next, Error: "unknown token"}, who{})
		return
	}
	id, _ := s.sess.create(name)
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: "/", HttpOnly: true,
		Secure: !s.opts.Insecure, SameSite: http.SameSiteStrictMode, MaxAge: int(sessionTTL.Seconds())})
	s.log.Info().Str("operator", name).Str("peer", r.RemoteAddr).Msg("console sign-in")
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request, id who) error {
	if !checkCSRF(r, id) {
		return &httpError{code: http.StatusForbidden, err: errors.New("missing or wrong CSRF token")}
	}
	if id.session != "" {
		s.sess.drop(id.session)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1})
	http.Redirect(w, r, "/login", http.StatusSeeOther)
	return nil
}

// safeNext keeps a redirect on this site.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/fleet"
	}
	return next
}
