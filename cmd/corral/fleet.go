package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"corral.dev/corral/controlplane/scheduler"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// adminFlags are the operator verbs' connection: the admin API's gRPC
// address and the operator's API key, sent as x-api-key metadata.
type adminFlags struct {
	addr, apiKey string
	timeout      time.Duration
	tls          clientTLS
}

func (a *adminFlags) register(cmd *cobra.Command) {
	f := cmd.PersistentFlags()
	f.StringVar(&a.addr, "server", envOr("CORRAL_ADMIN_ADDR", envOr("CORRAL_GRPC_ADDR", "127.0.0.1:8090")), "gRPC address of any control-plane node (admin API; default $CORRAL_ADMIN_ADDR, else $CORRAL_GRPC_ADDR as dev.env sets it)")
	f.StringVar(&a.apiKey, "api-key", os.Getenv("CORRAL_OPERATOR_KEY"), "operator API key (default $CORRAL_OPERATOR_KEY)")
	f.DurationVar(&a.timeout, "timeout", 30*time.Second, "how long a call may take (drains use --deadline plus this)")
	a.tls.register(f)
}

// call dials the node and runs fn with a context carrying the API key.
func (a *adminFlags) call(ctx context.Context, timeout time.Duration, fn func(context.Context, *grpc.ClientConn) error) error {
	conn, err := a.tls.dial(a.addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if a.apiKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", a.apiKey)
	}
	if err := fn(ctx, conn.ClientConn); err != nil {
		if hs := conn.handshakeFailure(); hs != nil {
			return fmt.Errorf("asking %s: %w", a.addr, hs)
		}
		return err
	}
	return nil
}

// callErr turns a gRPC error into one line naming what failed.
func callErr(what string, err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		return fmt.Errorf("%s: %s", what, st.Message())
	}
	return fmt.Errorf("%s: %w", what, err)
}

// providersColumn names each provider of h with its platform and health:
// "gvisor(systrap):ok", "runc:failing".
func providersColumn(h *adminv1.Host) string {
	if len(h.GetProviderDetails()) == 0 {
		return strings.Join(append(append([]string(nil), h.GetRuntimes()...), h.GetProviders()...), ",")
	}
	var parts []string
	for _, p := range h.GetProviderDetails() {
		name := p.GetName()
		if p.GetPlatform() != "" {
			name += "(" + p.GetPlatform() + ")"
		}
		health := "ok"
		if !p.GetHealthy() {
			health = "failing"
		}
		parts = append(parts, name+":"+health)
	}
	return strings.Join(parts, ",")
}

// placementsColumn says whether h takes new placements: "yes" or "no"
// (why is listed under the table).
func placementsColumn(h *adminv1.Host) string {
	if h.GetSchedulable() {
		return "yes"
	}
	return "no"
}

// healthReasons are h's failing conditions and providers, each with its
// reason and since when (down, cordoned and draining have their columns).
func healthReasons(h *adminv1.Host) []string {
	var out []string
	since := func(ts interface{ AsTime() time.Time }, set bool) string {
		if !set {
			return ""
		}
		return " (since " + ts.AsTime().UTC().Format(time.RFC3339) + ")"
	}
	for _, c := range h.GetConditions() {
		if !c.GetOk() {
			out = append(out, fmt.Sprintf("condition %s: %s%s", c.GetType(), c.GetReason(), since(c.GetSince(), c.GetSince() != nil)))
		}
	}
	for _, p := range h.GetProviderDetails() {
		if !p.GetHealthy() {
			out = append(out, fmt.Sprintf("provider %s: %s%s", p.GetName(), p.GetReason(), since(p.GetSince(), p.GetSince() != nil)))
		}
	}
	return out
}

func hostsCommand() *cobra.Command {
	var a adminFlags
	cmd := &cobra.Command{Use: "hosts", Short: "List, cordon, uncordon and drain sandbox hosts, and issue join tokens (admin API)"}
	a.register(cmd)
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List hosts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := adminv1.NewHostsServiceClient(c).ListHosts(ctx, &adminv1.ListHostsRequest{})
				if err != nil {
					return callErr("listing hosts", err)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "ID\tSTATUS\tELIGIBLE\tDRAINING\tSANDBOXES\tCPU (m)\tMEMORY (MiB)\tPOOL\tZONE\tPROVIDERS\tPLACEMENTS")
				for _, h := range resp.GetHosts() {
					fmt.Fprintf(w, "%s\t%s\t%t\t%t\t%d\t%d/%d\t%d/%d\t%s\t%s\t%s\t%s\n", h.GetId(), h.GetStatus(), h.GetEligible(), h.GetDraining(), h.GetSandboxes(),
						h.GetAllocated().GetCpuMillis(), h.GetCapacity().GetCpuMillis(), h.GetAllocated().GetMemoryMib(), h.GetCapacity().GetMemoryMib(),
						cmp.Or(h.GetLabels()[scheduler.PoolLabel], "-"), cmp.Or(h.GetLabels()[scheduler.ZoneLabel], "-"),
						providersColumn(h), placementsColumn(h))
				}
				if err := w.Flush(); err != nil {
					return err
				}
				// Why, under the table: every failing condition and provider,
				// with since when.
				for _, h := range resp.GetHosts() {
					for _, why := range healthReasons(h) {
						fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", h.GetId(), why)
					}
				}
				return nil
			})
		},
	}
	cordon := &cobra.Command{
		Use:   "cordon HOST",
		Short: "Stop placing new sandboxes on a host",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				if _, err := adminv1.NewHostsServiceClient(c).CordonHost(ctx, &adminv1.CordonHostRequest{HostId: args[0]}); err != nil {
					return callErr("cordoning "+args[0], err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "host %s cordoned\n", args[0])
				return nil
			})
		},
	}
	uncordon := &cobra.Command{
		Use:   "uncordon HOST",
		Short: "Let a cordoned or drained host take new sandboxes again",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				if _, err := adminv1.NewHostsServiceClient(c).UncordonHost(ctx, &adminv1.UncordonHostRequest{HostId: args[0]}); err != nil {
					return callErr("uncordoning "+args[0], err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "host %s uncordoned\n", args[0])
				return nil
			})
		},
	}
	var (
		deadline      time.Duration
		maxParallel   int
		detach, watch bool
	)
	drain := &cobra.Command{
		Use:   "drain HOST",
		Short: "Move a host's sandboxes to other hosts, evicting what remains at the deadline",
		Long: `Drain marks the host ineligible and starts its drain, which the cluster's
leader runs: it moves the host's sandboxes to other hosts between their tool
calls, --max-parallel at a time, and evicts what is left at --deadline. The
drain is kept in Raft: it goes on if this command ends (Ctrl-C, --detach) or
the node it talks to dies. --watch follows a drain already running; uncordon
stops one. On a terminal a progress bar shows the drain.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &adminv1.DrainHostRequest{HostId: args[0], Detach: detach, Watch: watch}
			timeout := deadline + a.timeout
			if watch {
				if cmd.Flags().Changed("deadline") || cmd.Flags().Changed("max-parallel") {
					return fmt.Errorf("--watch follows a running drain: it takes no --deadline or --max-parallel")
				}
				// The drain's own deadline bounds it; this only stops a
				// watch nobody ends.
				timeout = 24 * time.Hour
			} else {
				req.Deadline, req.MaxParallel = durationpb.New(deadline), int32(maxParallel)
			}
			out := cmd.OutOrStdout()
			bar := newDrainBar(out)
			return a.call(cmd.Context(), timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				stream, err := adminv1.NewHostsServiceClient(c).DrainHost(ctx, req)
				if err != nil {
					return callErr("draining "+args[0], err)
				}
				defer bar.end()
				for {
					p, err := stream.Recv()
					if errors.Is(err, io.EOF) {
						if detach {
							bar.end()
							fmt.Fprintf(out, "the drain of %s goes on; follow it with: corral hosts drain %s --watch\n", args[0], args[0])
						}
						return nil
					}
					if err != nil {
						return callErr("draining "+args[0], err)
					}
					bar.show(p)
				}
			})
		},
	}
	drain.Flags().DurationVar(&deadline, "deadline", 10*time.Minute, "when the sandboxes that have not moved are evicted")
	drain.Flags().IntVar(&maxParallel, "max-parallel", 0, "sandboxes moved at once (default 4, at most 64)")
	drain.Flags().BoolVar(&detach, "detach", false, "return once the drain has started; it goes on without this command")
	drain.Flags().BoolVar(&watch, "watch", false, "follow the drain running on the host; start none")
	var ttl time.Duration
	token := &cobra.Command{
		Use:   "token",
		Short: "Issue a one-time join token for a new host (corral host --join-token)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := adminv1.NewHostsServiceClient(c).IssueJoinToken(ctx, &adminv1.IssueJoinTokenRequest{Ttl: durationpb.New(ttl)})
				if err != nil {
					return callErr("issuing a join token", err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), resp.GetToken())
				return nil
			})
		},
	}
	token.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token may be used")
	cmd.AddCommand(ls, cordon, uncordon, drain, token)
	return cmd
}

func sandboxesCommand() *cobra.Command {
	var a adminFlags
	cmd := &cobra.Command{Use: "sandboxes", Short: "List and evict sandboxes (admin API)"}
	a.register(cmd)
	var host, tenant string
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List sandbox placements",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := adminv1.NewSandboxesServiceClient(c).ListSandboxes(ctx, &adminv1.ListSandboxesRequest{HostId: host, Tenant: tenant})
				if err != nil {
					return callErr("listing sandboxes", err)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "SESSION\tTENANT\tHOST\tSANDBOX\tPROVIDER\tCPU (m)\tMEMORY (MiB)")
				for _, s := range resp.GetSandboxes() {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%d\n", s.GetSessionId(), s.GetTenant(), s.GetHostId(), s.GetSandboxId(), cmp.Or(s.GetProvider(), s.GetRuntime(), "-"),
						s.GetResources().GetCpuMillis(), s.GetResources().GetMemoryMib())
				}
				return w.Flush()
			})
		},
	}
	ls.Flags().StringVar(&host, "host", "", "only this host's")
	ls.Flags().StringVar(&tenant, "tenant", "", "only this tenant's")
	evict := &cobra.Command{
		Use:   "evict SESSION_KEY",
		Short: "Stop a session's sandbox and release its placement",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				if _, err := adminv1.NewHostsServiceClient(c).EvictSandbox(ctx, &adminv1.EvictSandboxRequest{SessionId: args[0]}); err != nil {
					return callErr("evicting "+args[0], err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "sandbox of %s evicted\n", args[0])
				return nil
			})
		},
	}
	cmd.AddCommand(ls, evict)
	return cmd
}

func clusterCommand() *cobra.Command {
	var a adminFlags
	cmd := &cobra.Command{Use: "cluster", Short: "List and remove control-plane nodes (admin API)"}
	a.register(cmd)
	members := &cobra.Command{
		Use:   "members",
		Short: "List the Raft cluster's members, as the answering node knows them",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := adminv1.NewClusterServiceClient(c).ListMembers(ctx, &adminv1.ListMembersRequest{})
				if err != nil {
					return callErr("listing members", err)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NODE\tRAFT ADDRESS\tRAFT HTTP ADDRESS\tVOTER\tLEADER")
				for _, m := range resp.GetMembers() {
					fmt.Fprintf(w, "%s\t%s\t%s\t%t\t%t\n", m.GetNodeId(), m.GetRaftAddr(), m.GetRaftHttpAddr(), m.GetVoter(), m.GetLeader())
				}
				return w.Flush()
			})
		},
	}
	remove := &cobra.Command{
		Use:   "remove NODE",
		Short: "Remove a node from the cluster; its sessions move to the others",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				if _, err := adminv1.NewClusterServiceClient(c).RemoveMember(ctx, &adminv1.RemoveMemberRequest{NodeId: args[0]}); err != nil {
					return callErr("removing "+args[0], err)
				}
				fmt.Fprintf(cmd.OutOrStdout(), "node %s removed\n", args[0])
				return nil
			})
		},
	}
	cmd.AddCommand(members, remove)
	return cmd
}

// drainBar prints a drain's progress: a line per step and, on a terminal,
// a bar redrawn under them; elsewhere each line carries the counts.
type drainBar struct {
	w     io.Writer
	tty   bool
	drawn bool // a bar is on the terminal's last line
}

func newDrainBar(w io.Writer) *drainBar {
	f, ok := w.(*os.File)
	tty := false
	if ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &drainBar{w: w, tty: tty}
}

// barWidth is the bar's width in cells.
const barWidth = 30

func (b *drainBar) show(p *adminv1.DrainHostResponse) {
	counts := fmt.Sprintf("moved %d (%d live), evicted %d, remaining %d", p.GetMoved(), p.GetMovedLive(), p.GetEvicted(), p.GetRemaining())
	if !b.tty {
		if p.GetDone() {
			fmt.Fprintln(b.w, p.GetMessage())
			return
		}
		fmt.Fprintf(b.w, "%s: %s\n", counts, p.GetMessage())
		return
	}
	// Clear the bar, print the step above it, draw the bar again.
	fmt.Fprintf(b.w, "\r\033[K%s\n", p.GetMessage())
	total, done := p.GetTotal(), p.GetTotal()-p.GetRemaining()
	fill := barWidth
	if total > 0 {
		fill = int(done) * barWidth / int(total)
	}
	fmt.Fprintf(b.w, "[%s%s] %d/%d  %s", strings.Repeat("#", fill), strings.Repeat(".", barWidth-fill), done, total, counts)
	b.drawn = true
	if p.GetDone() {
		b.end()
	}
}

// end leaves the bar's line.
func (b *drainBar) end() {
	if b.drawn {
		fmt.Fprintln(b.w)
		b.drawn = false
	}
}
