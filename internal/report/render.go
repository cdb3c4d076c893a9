package report

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteTable writes a human-readable report: one line per check, its
// findings below it, and the reason for a skip or an error.
func WriteTable(w io.Writer, r *Report) error {
	gpus, hcas := len(r.Inventory.GPUs), len(r.Inventory.HCAs)
	head := fmt.Sprintf("node %s: %s", r.Node, strings.ToUpper(string(r.Status)))
	// Skipped checks measured nothing: a pass with most of them skipped
	// must not read as a clean bill of health.
	skipped := 0
	for _, c := range r.Checks {
		if c.Status == Skip {
			skipped++
		}
	}
	if skipped > 0 {
		head += fmt.Sprintf(" (%d of %d checks skipped)", skipped, len(r.Checks))
	}
	var inv []string
	if r.Inventory.DriverVersion != "" {
		inv = append(inv, "driver "+r.Inventory.DriverVersion)
	}
	inv = append(inv, fmt.Sprintf("%d GPUs", gpus), fmt.Sprintf("%d HCAs", hcas))
	if r.CollectedAt != "" {
		inv = append(inv, "at "+r.CollectedAt)
	}
	if _, err := fmt.Fprintf(w, "%s  (%s)\n\n", head, strings.Join(inv, ", ")); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	// The first failed write is the answer (a table cut short is not
	// printed); a tabwriter may report it on any write, not only at Flush.
	var werr error
	printf := func(format string, a ...any) {
		if werr == nil {
			_, werr = fmt.Fprintf(tw, format, a...)
		}
	}
	printf("CHECK\tSTATUS\tDETAIL\n")
	for _, c := range r.Checks {
		switch {
		case len(c.Findings) > 0:
			for i, f := range c.Findings {
				name, st := c.Name, string(c.Status)
				if i > 0 {
					name, st = "", ""
				}
				printf("%s\t%s\t%s %s: %s (%s: %s)\n", name, st, f.Component, f.Code, f.Message, f.Severity, f.Action)
			}
		case c.Reason != "":
			printf("%s\t%s\t%s\n", c.Name, c.Status, c.Reason)
		default:
			printf("%s\t%s\t\n", c.Name, c.Status)
		}
	}
	if werr != nil {
		return werr
	}
	return tw.Flush()
}
