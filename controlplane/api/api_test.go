package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"corral.dev/corral/internal/errdefs"
	"corral.dev/corral/internal/logging"
)

func TestUnaryInterceptorTranslatesErrors(t *testing.T) {
	ic := unaryInterceptor(logging.Discard())
	info := &grpc.UnaryServerInfo{FullMethod: "/x/Y"}
	tests := []struct {
		handler grpc.UnaryHandler
		code    codes.Code
		msg     string
	}{
		{func(context.Context, any) (any, error) { return nil, errdefs.NotFound("agent a") }, codes.NotFound, "agent a"},
		{func(context.Context, any) (any, error) { return nil, errors.New("secret db detail") }, codes.Internal, "internal error"},
		{func(context.Context, any) (any, error) { panic("boom") }, codes.Internal, "internal error"},
		{func(context.Context, any) (any, error) { return nil, status.Error(codes.Aborted, "as is") }, codes.Aborted, "as is"},
	}
	for _, tt := range tests {
		_, err := ic(context.Background(), nil, info, tt.handler)
		st := status.Convert(err)
		if st.Code() != tt.code || st.Message() != tt.msg {
			t.Errorf("got %v %q, want %v %q", st.Code(), st.Message(), tt.code, tt.msg)
		}
	}
}

func TestHTTPPanicBecomesEnvelope(t *testing.T) {
	h := withRequestContext(logging.Discard(), nil, nil, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		panic("boom")
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil))
	if rec.Code != 500 {
		t.Fatalf("status = %d", rec.Code)
	}
	var body ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if body.Error.Type != "api_error" || body.Error.Message != "internal error" || body.RequestID != rec.Header().Get(RequestIDHeader) {
		t.Fatalf("body = %+v", body)
	}
}

func TestWriteErrorConflictIsNotRetried(t *testing.T) {
	rec := httptest.NewRecorder()
	WriteError(rec, httptest.NewRequest("POST", "/x", nil), errdefs.Conflict("stale version"))
	if rec.Code != 409 || rec.Header().Get("x-should-retry") != "false" {
		t.Fatalf("status %d, x-should-retry %q", rec.Code, rec.Header().Get("x-should-retry"))
	}
}
