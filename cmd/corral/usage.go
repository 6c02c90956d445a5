package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	adminapi "corral.dev/corral/controlplane/api"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// usageCommand is `corral usage`: the usage report for billing.
func usageCommand() *cobra.Command {
	var (
		a                      adminFlags
		tenantID, since, until string
		granularity, output    string
	)
	cmd := &cobra.Command{
		Use:   "usage",
		Short: "Report model tokens and sandbox seconds (running, paused) by session (admin API; an operator's key, or a tenant admin's in $CORRAL_API_KEY)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch output {
			case "table", "json", "csv":
			default:
				return fmt.Errorf("--output %q: want table, json or csv", output)
			}
			now := time.Now()
			req := &adminv1.ExportUsageRequest{TenantId: tenantID, Granularity: granularity}
			var err error
			if req.StartTime, err = usageTime(since, now); err != nil {
				return fmt.Errorf("--since: %w", err)
			}
			if req.EndTime, err = usageTime(until, now); err != nil {
				return fmt.Errorf("--until: %w", err)
			}
			if a.apiKey == "" {
				a.apiKey = os.Getenv("CORRAL_API_KEY")
			}
			return a.call(cmd.Context(), a.timeout, func(ctx context.Context, c *grpc.ClientConn) error {
				resp, err := adminv1.NewUsageServiceClient(c).ExportUsage(ctx, req)
				if err != nil {
					return callErr("reading usage", err)
				}
				out := cmd.OutOrStdout()
				switch output {
				case "json":
					b, err := protojson.MarshalOptions{Multiline: true, EmitUnpopulated: true, UseProtoNames: true}.Marshal(resp)
					if err != nil {
						return err
					}
					_, err = fmt.Fprintln(out, string(b))
					return err
				case "csv":
					return adminapi.WriteUsageCSV(out, resp.GetRows())
				}
				w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "BUCKET\tTENANT\tSESSION\tMODEL\tINPUT\tOUTPUT\tCACHE READ\tCACHE WRITE\tRUNNING (s)\tPAUSED (s)")
				for _, r := range resp.GetRows() {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", r.GetBucketStart().AsTime().UTC().Format(time.RFC3339),
						r.GetTenantId(), r.GetSessionId(), dash(r.GetModel()), r.GetInputTokens(), r.GetOutputTokens(),
						r.GetCacheReadInputTokens(), r.GetCacheCreationInputTokens(),
						strconv.FormatFloat(r.GetRunningSeconds(), 'f', 1, 64), strconv.FormatFloat(r.GetPausedSeconds(), 'f', 1, 64))
				}
				return w.Flush()
			})
		},
	}
	a.register(cmd)
	f := cmd.Flags()
	f.StringVar(&tenantID, "tenant", "", "the tenant (operators; default every tenant); a tenant's admins read their own")
	f.StringVar(&since, "since", "", "start of the range: RFC 3339 time, or a duration before now (72h); default 30 days before --until")
	f.StringVar(&until, "until", "", "end of the range (exclusive): RFC 3339 time, or a duration before now; default the next whole hour")
	f.StringVar(&granularity, "granularity", "day", "bucket size: hour or day (UTC)")
	f.StringVarP(&output, "output", "o", "table", "output format: table, json or csv")
	return cmd
}

// usageTime reads a flag's time: RFC 3339, or a duration before now; ""
// is nil (the server's default).
func usageTime(s string, now time.Time) (*timestamppb.Timestamp, error) {
	if s == "" {
		return nil, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return timestamppb.New(now.Add(-d)), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return nil, fmt.Errorf("%q is neither an RFC 3339 time nor a duration", s)
	}
	return timestamppb.New(t), nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
