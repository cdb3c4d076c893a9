package console

import (
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"time"
)

// ago says how long before now t was, for people ("3m ago").
func ago(now, t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// stamp is a time in UTC as logs write it.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// query builds "?k=v&..." from pairs, leaving out empty values: the URL of
// a view with its filters.
func query(path string, kv ...any) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		k := fmt.Sprint(kv[i])
		switch x := kv[i+1].(type) {
		case string:
			if x != "" {
				v.Set(k, x)
			}
		case int:
			if x > 1 {
				v.Set(k, strconv.Itoa(x))
			}
		}
	}
	if len(v) == 0 {
		return path
	}
	return path + "?" + v.Encode()
}

func num(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

func secs(p *float64) string {
	if p == nil {
		return "-"
	}
	return (time.Duration(*p * float64(time.Second))).Round(100 * time.Millisecond).String()
}

func contains(xs []string, x string) bool { return slices.Contains(xs, x) }
