package main

import (
	"context"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

func buildsCommand() *cobra.Command {
	var a adminFlags
	cmd := &cobra.Command{Use: "builds", Short: "Environment package builds: the images environments' packages are installed into (admin API)"}
	a.register(cmd)
	var tenantID, environmentID string
	var limit int32
	var showLog bool
	ls := &cobra.Command{
		Use:   "ls",
		Short: "List a tenant's environment builds, newest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := adminv1.NewTenantsServiceClient(c).ListEnvironmentBuilds(ctx, &adminv1.ListEnvironmentBuildsRequest{
					TenantId: tenantID, EnvironmentId: environmentID, PageSize: limit,
				})
				if err != nil {
					return callErr("listing environment builds", err)
				}
				out := cmd.OutOrStdout()
				if environmentID != "" && len(resp.GetBuilds()) == 0 {
					fmt.Fprintf(out, "environment %s has no packages: its sessions run their class's image\n", environmentID)
					return nil
				}
				w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "KEY\tSTATUS\tCREATED\tTOOK\tENVIRONMENT\tHOST\tLAYER\tPACKAGES\tERROR")
				for _, b := range resp.GetBuilds() {
					took := "-"
					if b.GetStartedAt() != nil && b.GetFinishedAt() != nil {
						took = b.GetFinishedAt().AsTime().Sub(b.GetStartedAt().AsTime()).Round(100 * time.Millisecond).String()
					}
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", b.GetKey()[:min(12, len(b.GetKey()))], b.GetStatus(),
						b.GetCreatedAt().AsTime().UTC().Format(time.RFC3339), took, b.GetEnvironmentId(), b.GetHostId(),
						b.GetLayerBytes(), b.GetPackages(), b.GetError())
				}
				if err := w.Flush(); err != nil {
					return err
				}
				if showLog {
					for _, b := range resp.GetBuilds() {
						fmt.Fprintf(out, "\n--- build %s (%s) log ---\n%s", b.GetKey(), b.GetStatus(), b.GetLog())
					}
				}
				return nil
			})
		},
	}
	ls.Flags().StringVar(&tenantID, "tenant", "", "tenant id (required for operators; a tenant's key lists its own)")
	ls.Flags().StringVar(&environmentID, "environment", "", "only the build this environment's packages name now (what its next session runs)")
	ls.Flags().Int32Var(&limit, "limit", 100, "at most this many (at most 1000)")
	ls.Flags().BoolVar(&showLog, "log", false, "print each build's log (its last 64 KiB) after the table")
	cmd.AddCommand(ls)
	return cmd
}
