package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/hostagent/hostctl"
	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/errdefs/errgrpc"
	"corral.dev/corral/internal/hostpki"
	pb "corral.dev/corral/proto/gen/corral/hostagent/v1"
)

// hostctlCommand is the in-repo test controller's CLI: `serve` runs it, the
// other verbs talk to a running one through the socket in its directory and
// to hosts directly.
func hostctlCommand(g *globalFlags) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "hostctl",
		Short: "Test controller for host agents: join tokens, sandbox assignments, exec (until the control plane drives hosts)",
	}
	cmd.PersistentFlags().StringVar(&dir, "dir", ".corral/hostctl", "the controller's directory: CA, local control socket")
	sock := func() string { return filepath.Join(dir, "hostctl.sock") }
	client := func() (*hostctl.LocalClient, error) { return hostctl.NewLocalClient(sock()) }

	var listen string
	var interval time.Duration
	serve := &cobra.Command{
		Use:   "serve",
		Short: "Run the test controller; print its address and a join token",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := g.logger()
			if err != nil {
				return err
			}
			c, err := hostctl.New(hostctl.Config{Dir: dir, HeartbeatInterval: interval, Logger: log})
			if err != nil {
				return err
			}
			l, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			srv := c.Serve(l)
			defer srv.Stop()
			_ = os.Remove(sock())
			ul, err := net.Listen("unix", sock())
			if err != nil {
				return fmt.Errorf("local control socket: %w", err)
			}
			if err := os.Chmod(sock(), 0o600); err != nil {
				return err
			}
			hs := &http.Server{Handler: hostctl.LocalHandler(c)}
			go hs.Serve(ul)
			defer hs.Close()
			tok, err := c.IssueToken(time.Hour)
			if err != nil {
				return err
			}
			fmt.Printf("hostctl listening on %s\n", l.Addr())
			fmt.Printf("join token (one use, 1h): %s\n", tok.Reveal())
			fmt.Printf("start a host with: corral host --control-plane %s --join-token %s\n", l.Addr(), tok.Reveal())
			<-cmd.Context().Done()
			return nil
		},
	}
	serve.Flags().StringVar(&listen, "listen", "127.0.0.1:8442", "listen address of the host service")
	serve.Flags().DurationVar(&interval, "heartbeat-interval", 10*time.Second, "heartbeat interval hosts are told")

	token := &cobra.Command{
		Use:   "token",
		Short: "Issue another one-time join token",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			t, err := c.Token(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Println(t)
			return nil
		},
	}
	hosts := &cobra.Command{
		Use:   "hosts",
		Short: "Show the hosts the controller knows, their sandboxes and conditions",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			hs, err := c.Hosts(cmd.Context())
			if err != nil {
				return err
			}
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(hs)
		},
	}

	var host, key string
	sandboxFlags := func(c *cobra.Command) {
		c.Flags().StringVar(&host, "host", "", "host id (required)")
		c.Flags().StringVar(&key, "key", "", "sandbox key (required)")
		c.MarkFlagRequired("host")
		c.MarkFlagRequired("key")
	}
	var ens hostctl.EnsureRequest
	ensure := &cobra.Command{
		Use:   "ensure",
		Short: "Place a sandbox on a host and wait until it is ready",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			ens.Host, ens.Key = host, key
			st, err := c.Ensure(cmd.Context(), ens)
			if err != nil {
				return err
			}
			fmt.Println(string(st))
			return nil
		},
	}
	sandboxFlags(ensure)
	ensure.Flags().StringVar(&ens.Image, "image", "localhost/corral/debian:bookworm-2", "image")
	ensure.Flags().StringVar(&ens.Runtime, "runtime", "", "runtime the host must run (default: the host's)")
	destroy := &cobra.Command{
		Use:   "destroy",
		Short: "Remove a sandbox and its workspace",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := client()
			if err != nil {
				return err
			}
			return c.Destroy(cmd.Context(), host, key)
		},
	}
	sandboxFlags(destroy)

	// dialHost connects to a host's SandboxService as the control plane.
	dialHost := func(ctx context.Context) (pb.SandboxServiceClient, func() error, error) {
		c, err := client()
		if err != nil {
			return nil, nil, err
		}
		h, err := c.Host(ctx, host)
		if err != nil {
			return nil, nil, err
		}
		if _, err := os.Stat(filepath.Join(dir, "ca.pem")); err != nil {
			return nil, nil, errdefs.Wrap(errdefs.FailedPreconditionKind, err, "no CA in %s", dir)
		}
		ca, err := hostpki.LoadOrCreateCA(dir, "")
		if err != nil {
			return nil, nil, err
		}
		cert, err := ca.IssueControlPlane(time.Hour)
		if err != nil {
			return nil, nil, err
		}
		return hostctl.DialSandbox(ca, cert, host, h.SandboxAddress)
	}
	var timeout time.Duration
	exec := &cobra.Command{
		Use:   "exec -- COMMAND [ARG...]",
		Short: "Run a command in a sandbox, streaming its output; exit with its exit code",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, closeFn, err := dialHost(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			st, err := sc.Exec(cmd.Context(), &pb.ExecRequest{Key: key, Command: args, Timeout: durationpb.New(timeout)})
			if err != nil {
				return errgrpc.FromStatus(err)
			}
			for {
				m, err := st.Recv()
				if errors.Is(err, io.EOF) {
					return errors.New("exec ended without a result")
				}
				if err != nil {
					return errgrpc.FromStatus(err)
				}
				if o := m.GetOutput(); o != nil {
					w := os.Stdout
					if o.Stream == pb.OutputStream_OUTPUT_STREAM_STDERR {
						w = os.Stderr
					}
					w.Write(o.Data)
				}
				if r := m.GetResult(); r != nil {
					if r.TimedOut {
						fmt.Fprintf(os.Stderr, "corral: timed out after %s\n", r.Duration.AsDuration())
					}
					if r.ExitCode != 0 {
						os.Exit(int(r.ExitCode))
					}
					return nil
				}
			}
		},
	}
	sandboxFlags(exec)
	exec.Flags().DurationVar(&timeout, "timeout", 0, "time limit (default: the host's)")
	read := &cobra.Command{
		Use:   "read PATH",
		Short: "Print a workspace file",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sc, closeFn, err := dialHost(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			r, err := sc.ReadFile(cmd.Context(), &pb.ReadFileRequest{Key: key, Path: args[0]})
			if err != nil {
				return errgrpc.FromStatus(err)
			}
			_, err = os.Stdout.Write(r.Data)
			return err
		},
	}
	sandboxFlags(read)
	write := &cobra.Command{
		Use:   "write PATH < DATA",
		Short: "Write standard input to a workspace file",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			data, err := io.ReadAll(os.Stdin)
			if err != nil {
				return err
			}
			sc, closeFn, err := dialHost(cmd.Context())
			if err != nil {
				return err
			}
			defer closeFn()
			_, err = sc.WriteFile(cmd.Context(), &pb.WriteFileRequest{Key: key, Path: args[0], Data: data})
			return errgrpc.FromStatus(err)
		},
	}
	sandboxFlags(write)
	cmd.AddCommand(serve, token, hosts, ensure, destroy, exec, read, write)
	return cmd
}
