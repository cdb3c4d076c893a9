package main

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// printer writes a command's lines and keeps the first write error, so a
// table of many lines checks once, at its end (pr.err), the way
// bufio.Writer does. A write to a closed pipe on stdout (`fleetcheck
// nodes | head -1`) ends the process with SIGPIPE, the Go runtime's
// convention for fd 1; on any other writer the error fails the command,
// so a cut-short document is never reported as printed.
type printer struct {
	w   io.Writer
	err error
}

func newPrinter(w io.Writer) *printer { return &printer{w: w} }

func (p *printer) printf(format string, a ...any) {
	if p.err == nil {
		_, err := fmt.Fprintf(p.w, format, a...)
		p.err = wrote(err)
	}
}

func (p *printer) println(a ...any) {
	if p.err == nil {
		_, err := fmt.Fprintln(p.w, a...)
		p.err = wrote(err)
	}
}

// writeError is a failed write of the command's own output: not the
// coordinator's doing, so rpcError passes it on as it is.
type writeError struct{ err error }

func (e writeError) Error() string { return "write output: " + e.err.Error() }
func (e writeError) Unwrap() error { return e.err }

// wrote marks a write's error as the output's; nil stays nil.
func wrote(err error) error {
	if err == nil {
		return nil
	}
	return writeError{err}
}

// flush ends a table written through p: the first write error, else what
// the tabwriter's Flush says.
func (p *printer) flush(tw *tabwriter.Writer) error {
	if p.err != nil {
		return p.err
	}
	return wrote(tw.Flush())
}
