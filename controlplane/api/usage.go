package api

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"google.golang.org/protobuf/types/known/timestamppb"

	"corral.dev/corral/controlplane/auth"
	"corral.dev/corral/controlplane/store"
	"corral.dev/corral/controlplane/tenant"
	"corral.dev/corral/internal/errdefs"
	adminv1 "corral.dev/corral/proto/gen/corral/admin/v1"
)

// Bounds of a usage report.
const (
	maxUsageHours     = 31 * 24 // by hour
	maxUsageDays      = 400     // by day
	defaultUsageRange = 30 * 24 * time.Hour
	defaultUsagePage  = 500
	maxUsagePage      = 5000
	// MaxUsageExportRows bounds ExportUsage.
	MaxUsageExportRows = 100_000
)

// UsageStore is the usage record (store.Usage).
type UsageStore interface {
	Report(ctx context.Context, q store.UsageQuery) ([]store.UsageRow, error)
	ReportAll(ctx context.Context, only tenant.ID, q store.UsageQuery) ([]store.UsageRow, error)
}

// UsageService implements adminv1.UsageServiceServer over the usage
// record (controlplane/usage).
type UsageService struct {
	adminv1.UnimplementedUsageServiceServer
	Usage   UsageStore
	Tenants interface {
		Get(ctx context.Context, id tenant.ID) (store.Tenant, error)
	}
	// Now is the clock (default time.Now).
	Now func() time.Time
}

func (s *UsageService) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

// usageQuery is a checked report request: whose, which range, how.
type usageQuery struct {
	all  bool      // an operator's, over every tenant
	only tenant.ID // the tenant (a tenant's principal: theirs)
	q    store.UsageQuery
}

// query checks a request's tenant, range and granularity.
func (s *UsageService) query(ctx context.Context, tenantID string, start, end *timestamppb.Timestamp, unit string) (usageQuery, error) {
	var uq usageQuery
	p, ok := auth.From(ctx)
	switch {
	case ok && !p.Fleet():
		if tenantID != "" && tenant.ID(tenantID) != p.Tenant {
			return uq, errdefs.PermissionDenied("a tenant's principals read only their own tenant's usage")
		}
		uq.only = p.Tenant
	case tenantID == "":
		uq.all = true
	default:
		id := tenant.ID(tenantID)
		if id.Validate() != nil {
			return uq, errdefs.NotFound("tenant %s not found", id)
		}
		if _, err := s.Tenants.Get(ctx, id); err != nil {
			return uq, err
		}
		uq.only = id
	}
	switch unit {
	case "", store.UsageDay:
		unit = store.UsageDay
	case store.UsageHour:
	default:
		return uq, errdefs.InvalidArgument("granularity must be hour or day, not %q", unit)
	}
	now := s.now().UTC()
	e := now.Truncate(time.Hour).Add(time.Hour)
	if end != nil {
		if err := end.CheckValid(); err != nil {
			return uq, errdefs.InvalidArgument("end_time: %v", err)
		}
		e = ceilHour(end.AsTime())
	}
	st := e.Add(-defaultUsageRange)
	if start != nil {
		if err := start.CheckValid(); err != nil {
			return uq, errdefs.InvalidArgument("start_time: %v", err)
		}
		st = start.AsTime().UTC().Truncate(time.Hour)
	}
	if unit == store.UsageDay && start == nil {
		st = st.Truncate(24 * time.Hour)
	}
	hours := e.Sub(st) / time.Hour
	switch {
	case !st.Before(e):
		return uq, errdefs.InvalidArgument("start_time must be before end_time")
	case unit == store.UsageHour && hours > maxUsageHours:
		return uq, errdefs.InvalidArgument("by hour a report spans at most %d days", maxUsageHours/24)
	case unit == store.UsageDay && hours > maxUsageDays*24:
		return uq, errdefs.InvalidArgument("by day a report spans at most %d days", maxUsageDays)
	}
	uq.q = store.UsageQuery{Start: st, End: e, Unit: unit, Now: now}
	return uq, nil
}

func ceilHour(t time.Time) time.Time {
	t = t.UTC()
	if r := t.Truncate(time.Hour); !r.Equal(t) {
		return r.Add(time.Hour)
	}
	return t
}

func (s *UsageService) read(ctx context.Context, uq usageQuery) ([]store.UsageRow, error) {
	if uq.all {
		return s.Usage.ReportAll(ctx, "", uq.q)
	}
	if p, ok := auth.From(ctx); ok && !p.Fleet() {
		return s.Usage.Report(tenant.With(ctx, uq.only), uq.q)
	}
	return s.Usage.ReportAll(ctx, uq.only, uq.q)
}

// GetUsage returns a page of the report.
func (s *UsageService) GetUsage(ctx context.Context, req *adminv1.GetUsageRequest) (*adminv1.GetUsageResponse, error) {
	uq, err := s.query(ctx, req.GetTenantId(), req.GetStartTime(), req.GetEndTime(), req.GetGranularity())
	if err != nil {
		return nil, err
	}
	size := int(req.GetPageSize())
	switch {
	case size <= 0:
		size = defaultUsagePage
	case size > maxUsagePage:
		size = maxUsagePage
	}
	if tok := req.GetPageToken(); tok != "" {
		off, now, err := parseUsageToken(tok)
		if err != nil {
			return nil, err
		}
		// Later pages read as of the first one's now.
		uq.q.Offset, uq.q.Now = off, now
	}
	uq.q.Limit = size + 1
	rows, err := s.read(ctx, uq)
	if err != nil {
		return nil, err
	}
	out := &adminv1.GetUsageResponse{StartTime: timestamppb.New(uq.q.Start), EndTime: timestamppb.New(uq.q.End), Granularity: uq.q.Unit}
	if len(rows) > size {
		rows = rows[:size]
		out.NextPageToken = usageToken(uq.q.Offset+size, uq.q.Now)
	}
	out.Rows = usageRowsPB(rows)
	return out, nil
}

// ExportUsage returns the whole report, bounded.
func (s *UsageService) ExportUsage(ctx context.Context, req *adminv1.ExportUsageRequest) (*adminv1.ExportUsageResponse, error) {
	switch req.GetFormat() {
	case "", "json", "csv":
	default:
		return nil, errdefs.InvalidArgument("format must be json or csv, not %q", req.GetFormat())
	}
	uq, err := s.query(ctx, req.GetTenantId(), req.GetStartTime(), req.GetEndTime(), req.GetGranularity())
	if err != nil {
		return nil, err
	}
	uq.q.Limit = MaxUsageExportRows + 1
	rows, err := s.read(ctx, uq)
	if err != nil {
		return nil, err
	}
	if len(rows) > MaxUsageExportRows {
		return nil, errdefs.ResourceExhausted("the report has more than %d rows: narrow the range or page through GetUsage", MaxUsageExportRows)
	}
	return &adminv1.ExportUsageResponse{Rows: usageRowsPB(rows), StartTime: timestamppb.New(uq.q.Start), EndTime: timestamppb.New(uq.q.End), Granularity: uq.q.Unit}, nil
}

func usageRowsPB(rows []store.UsageRow) []*adminv1.UsageRow {
	out := make([]*adminv1.UsageRow, 0, len(rows))
	for _, r := range rows {
		out = append(out, &adminv1.UsageRow{
			BucketStart: timestamppb.New(r.Bucket), TenantId: string(r.Tenant), SessionId: r.SessionID, Model: r.Model,
			InputTokens: r.InputTokens, OutputTokens: r.OutputTokens,
			CacheReadInputTokens: r.CacheReadInputTokens, CacheCreationInputTokens: r.CacheCreationInputTokens,
			RunningSeconds: r.RunningSeconds, PausedSeconds: r.PausedSeconds,
		})
	}
	return out
}

// A page token is "<offset>.<now in unix nanoseconds>", base64url.
func usageToken(off int, now time.Time) string {
	return base64.RawURLEncoding.EncodeToString(fmt.Appendf(nil, "%d.%d", off, now.UnixNano()))
}

func parseUsageToken(tok string) (int, time.Time, error) {
	bad := errdefs.InvalidArgument("page_token is not one this API issued")
	if len(tok) > 64 {
		return 0, time.Time{}, bad
	}
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return 0, time.Time{}, bad
	}
	o, n, ok := strings.Cut(string(b), ".")
	off, err1 := strconv.Atoi(o)
	ns, err2 := strconv.ParseInt(n, 10, 64)
	if !ok || err1 != nil || err2 != nil || off < 0 || off > MaxUsageExportRows*10 {
		return 0, time.Time{}, bad
	}
	return off, time.Unix(0, ns).UTC(), nil
}

// UsageCSVHeader is the first line of a usage export in CSV.
var UsageCSVHeader = []string{"bucket_start", "tenant_id", "session_id", "model", "input_tokens", "output_tokens",
	"cache_read_input_tokens", "cache_creation_input_tokens", "running_seconds", "paused_seconds"}

// WriteUsageCSV writes rows as CSV, header first (the gateway's CSV
// answer and the CLI's --output csv).
func WriteUsageCSV(w io.Writer, rows []*adminv1.UsageRow) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(UsageCSVHeader); err != nil {
		return err
	}
	for _, r := range rows {
		if err := cw.Write([]string{
			r.GetBucketStart().AsTime().UTC().Format(time.RFC3339), r.GetTenantId(), r.GetSessionId(), r.GetModel(),
			strconv.FormatInt(r.GetInputTokens(), 10), strconv.FormatInt(r.GetOutputTokens(), 10),
			strconv.FormatInt(r.GetCacheReadInputTokens(), 10), strconv.FormatInt(r.GetCacheCreationInputTokens(), 10),
			strconv.FormatFloat(r.GetRunningSeconds(), 'f', 3, 64), strconv.FormatFloat(r.GetPausedSeconds(), 'f', 3, 64),
		}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// csvMarshaler answers ExportUsage in CSV (a request that accepts
// text/csv); every other message, and decoding, stay JSON.
type csvMarshaler struct{ runtime.Marshaler }

// Marshal implements runtime.Marshaler.
func (m csvMarshaler) Marshal(v any) ([]byte, error) {
	if r, ok := v.(*adminv1.ExportUsageResponse); ok {
		var b bytes.Buffer
		if err := WriteUsageCSV(&b, r.GetRows()); err != nil {
			return nil, err
		}
		return b.Bytes(), nil
	}
	return m.Marshaler.Marshal(v)
}

// ContentType implements runtime.Marshaler.
func (m csvMarshaler) ContentType(v any) string {
	if _, ok := v.(*adminv1.ExportUsageResponse); ok {
		return "text/csv; charset=utf-8"
	}
	return m.Marshaler.ContentType(v)
}
