package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// Operator is a client of the coordinator's operator API.
type Operator struct {
	cc *grpc.ClientConn
	c  pb.OperatorServiceClient
}

// DialOperator connects to the coordinator at addr (127.0.0.1 only).
func DialOperator(addr string) (*Operator, error) {
	if err := Loopback(addr); err != nil {
		return nil, err
	}
	cc, err := grpc.NewClient(addr, dialOptions()...)
	if err != nil {
		return nil, fmt.Errorf("operator client: %w", err)
	}
	return &Operator{cc: cc, c: pb.NewOperatorServiceClient(cc)}, nil
}

// Close closes the connection.
func (o *Operator) Close() error { return o.cc.Close() }

// WaitReady waits until the coordinator answers operator calls: its store
// is open and recovered.
func (o *Operator) WaitReady(ctx context.Context) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := o.c.ListNodes(cctx, &pb.ListNodesRequest{Selector: "name=loadgen-probe"})
		cancel()
		if err == nil {
			return nil
		}
		if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
			return fmt.Errorf("coordinator not ready: %w", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("coordinator not ready: %w (last: %v)", ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// CheckRun is one fleet-wide RunCheck, timed from the request to the final
// progress message: the coordinator sends that only once every node's
// result is stored (or the node refused, timed out or was unreachable).
type CheckRun struct {
	Start time.Time
	Took  time.Duration
	Final *pb.RunCheckProgress
}

// RunCheck asks every node the selector picks to run checks and waits for
// the final progress.
func (o *Operator) RunCheck(ctx context.Context, selector string, checks []string, timeout time.Duration) (CheckRun, error) {
	start := time.Now()
	stream, err := o.c.RunCheck(ctx, &pb.RunCheckRequest{Selector: selector, Checks: checks, TimeoutMs: timeout.Milliseconds()})
	if err != nil {
		return CheckRun{}, fmt.Errorf("run check: %w", err)
	}
	for {
		p, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return CheckRun{}, errors.New("run check: stream ended without a final message")
		}
		if err != nil {
			return CheckRun{}, fmt.Errorf("run check: %w", err)
		}
		if p.GetFinal() {
			return CheckRun{Start: start, Took: time.Since(start), Final: p}, nil
		}
	}
}

// CLIOutcome is what `fleetcheck check -o json` printed.
type CLIOutcome struct {
	WorkID      string `json:"work_id"`
	Total       int32  `json:"total"`
	Done        int32  `json:"done"`
	Refused     int32  `json:"refused"`
	Failed      int32  `json:"failed"`
	Unreachable int32  `json:"unreachable"`
	TimedOut    int32  `json:"timed_out"`
}

// RunCLICheck runs `BIN check ” --checks LIST` against addr, as an
// operator would, and times it from the start of the process to its exit.
// Exit status 1 (a node did not pass) is an outcome, not an error.
func RunCLICheck(ctx context.Context, bin, addr string, checks []string, timeout time.Duration) (time.Duration, CLIOutcome, error) {
	if err := Loopback(addr); err != nil {
		return 0, CLIOutcome{}, err
	}
	cmd := exec.CommandContext(ctx, bin, "check", "", "--insecure", "--checks", strings.Join(checks, ","),
		"--coordinator", addr, "--timeout", timeout.String(), "-o", "json")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		return took, CLIOutcome{}, fmt.Errorf("%s check: %w: %s", bin, err, strings.TrimSpace(errb.String()))
	}
	var res CLIOutcome
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return took, CLIOutcome{}, fmt.Errorf("%s check: output: %w", bin, err)
	}
	return took, res, nil
}
