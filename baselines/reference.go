package baselines

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
)

// referenceFS holds the shipped reference SKU baselines. go:embed needs a
// package-level variable; an embed.FS cannot be changed.
//
//go:embed reference/*.yaml
var referenceFS embed.FS

// Reference returns the shipped reference SKU baselines (files under
// reference/), validated, in file order. They carry no stack and no
// version; TakenAt is the date of their public source.
func Reference() ([]Baseline, error) {
	es, err := referenceEntries()
	if err != nil {
		return nil, err
	}
	out := make([]Baseline, len(es))
	for i, e := range es {
		out[i] = e.b
	}
	return out, nil
}

func referenceEntries() ([]entry, error) {
	names, err := fs.Glob(referenceFS, "reference/*.yaml")
	if err != nil {
		return nil, fmt.Errorf("reference baselines: %w", err)
	}
	slices.Sort(names)
	var all []entry
	for _, n := range names {
		data, err := referenceFS.ReadFile(n)
		if err != nil {
			return nil, fmt.Errorf("reference baselines %s: %w", path.Base(n), err)
		}
		es, err := parseYAML(data)
		if err != nil {
			return nil, fmt.Errorf("reference baselines %s: %w", path.Base(n), err)
		}
		all = append(all, es...)
	}
	if errs := duplicates(all); len(errs) > 0 {
		return nil, fmt.Errorf("reference baselines: %w: %w", ErrInvalid, errs[0])
	}
	return all, nil
}

// ImportReference stores each shipped reference baseline whose key has
// no version yet, so a coordinator can run it on every start: a key that
// already has one (the reference, or a value an operator set there) is
// left alone. To replace stored values with a newer release's figures,
// Import the files explicitly.
func (s *Store) ImportReference(ctx context.Context, who string) (ImportResult, error) {
	es, err := referenceEntries()
	if err != nil {
		return ImportResult{}, err
	}
	return s.importEntries(ctx, es, who, true)
}
