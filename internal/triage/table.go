package triage

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// errWriter keeps the first write error, so a table checks once.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) printf(format string, a ...any) {
	if e.err == nil {
		_, e.err = fmt.Fprintf(e.w, format, a...)
	}
}

// WriteTable prints the report for a person: the verdict first, then the
// timeline, times in loc. It returns the first write error.
func WriteTable(w io.Writer, rep Report, loc *time.Location) error {
	if loc == nil {
		loc = time.Local
	}
	stamp := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.In(loc).Format("2006-01-02 15:04:05")
	}
	head := &errWriter{w: w}
	head.printf("node:    %s\n", rep.Node)
	if rep.Job != "" {
		head.printf("job:     %s\n", rep.Job)
	}
	head.printf("bucket:  %s\n", rep.Bucket)
	head.printf("rule:    %s\n", rep.Rule)
	head.printf("reason:  %s\n\n", rep.Reason)
	if head.err != nil {
		return head.err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	p := &errWriter{w: tw}
	p.printf("TIME\tSOURCE\tKIND\tCOMPONENT\tDETAIL\n")
	for _, e := range rep.Timeline {
		p.printf("%s\t%s\t%s\t%s\t%s\n", stamp(e.At), e.Source, e.Kind, orDash(e.Component), e.Detail)
	}
	if p.err != nil {
		return p.err
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Timeline) == 0 {
		head.printf("(nothing on the timeline)\n")
	}
	for i, n := range rep.Notes {
		if i == 0 {
			head.printf("\nnotes:\n")
		}
		head.printf("- %s\n", n)
	}
	return head.err
}
