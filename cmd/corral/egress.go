package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

func egressCommand() *cobra.Command {
	var a adminFlags
	cmd := &cobra.Command{Use: "egress", Short: "The egress audit trail: every connection sandboxes opened through their hosts' proxies (admin API)"}
	a.register(cmd)
	var tenantID, sessionID string
	var limit int32
	var before int64
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List a tenant's egress connections, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := adminv1.NewTenantsServiceClient(c).ListEgressConnections(ctx, &adminv1.ListEgressConnectionsRequest{
					TenantId: tenantID, SessionId: sessionID, BeforeId: before, PageSize: limit,
				})
				if err != nil {
					return callErr("listing egress connections", err)
				}
				w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "ID\tSTARTED\tSESSION\tDESTINATION\tVERDICT\tUP\tDOWN\tREASON")
				for _, e := range resp.GetConnections() {
					verdict := "denied"
					if e.GetAllowed() {
						verdict = "allowed"
					}
					if e.GetCredentialInjected() {
						verdict += ",credential"
					}
					fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", e.GetId(), e.GetStartedAt().AsTime().UTC().Format(time.RFC3339),
						e.GetSessionId(), net.JoinHostPort(e.GetHost(), strconv.Itoa(int(e.GetPort()))), verdict,
						e.GetBytesUp(), e.GetBytesDown(), e.GetReason())
				}
				if err := w.Flush(); err != nil {
					return err
				}
				if n := resp.GetNextBeforeId(); n != 0 {
					fmt.Fprintf(cmd.OutOrStdout(), "more: --before %d\n", n)
				}
				return nil
			})
		},
	}
	ls.Flags().StringVar(&tenantID, "tenant", "", "tenant id (required for operators; a tenant's key lists its own)")
	ls.Flags().StringVar(&sessionID, "session", "", "only this session's connections")
	ls.Flags().Int32Var(&limit, "limit", 100, "at most this many (at most 1000)")
	ls.Flags().Int64Var(&before, "before", 0, "only connections with ids below this (paging)")
	cmd.AddCommand(ls)
	return cmd
}
