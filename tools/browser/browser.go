// Package browser drives Debian's chromium, headless, with chromedp: for tests that
// assert on a page as a browser renders it, and for taking screenshots. The browser
// reaches loopback addresses only.
package browser

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"os/exec"
	"testing"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// InstallHint is the one line that says how to get the browser.
const InstallHint = "chromium is not installed: apt-get install chromium (or scripts/install-deps.sh test)"

// Path finds the chromium binary.
func Path() (string, error) {
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
	}
	if _, err := os.Stat("/usr/lib/chromium/chromium"); err == nil {
		return "/usr/lib/chromium/chromium", nil
	}
	return "", errors.New(InstallHint)
}

// Start starts a headless chromium and returns a context for chromedp actions in one
// tab; cancel stops the browser. TLS certificates are not checked (tests serve
// self-signed ones), and every host name but 127.0.0.1 and localhost fails to resolve,
// so the browser sends nothing beyond this machine.
func Start(parent context.Context) (context.Context, context.CancelFunc, error) {
	path, err := Path()
	if err != nil {
		return nil, nil, err
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // as root, chromium refuses to start with its sandbox
		chromedp.DisableGPU,
		chromedp.IgnoreCertErrors,
		chromedp.WindowSize(1400, 1000),
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost"),
		chromedp.Flag("no-proxy-server", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-domain-reliability", true),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(parent, opts...)
	ctx, cancelCtx := chromedp.NewContext(alloc)
	cancel := func() { cancelCtx(); cancelAlloc() }
	// The first action starts the browser and opens the tab. It runs on ctx itself: a
	// context derived for it would close the browser when it ends.
	if err := chromedp.Do(ctx); err != nil {
		cancel()
		return nil, nil, err
	}
	return ctx, cancel, nil
}

// New is Start for a test: a missing chromium fails the test with InstallHint, and the
// browser stops when the test ends.
func New(t testing.TB) context.Context {
	t.Helper()
	if _, err := Path(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel, err := Start(context.Background())
	if err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	t.Cleanup(cancel)
	return ctx
}

// BasicAuth makes the tab send these credentials with every request from now on.
func BasicAuth(user, password string) chromedp.Action[chromedp.Void] {
	return Header("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":"+password)))
}

// Header makes the tab send this header with every request from now on; an empty
// value stops sending extra headers.
func Header(name, value string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		h := network.Headers{}
		if value != "" {
			h[name] = value
		}
		_, err := cdp.Call(ctx, t, network.SetExtraHTTPHeaders, network.SetExtraHTTPHeadersParams{Headers: h})
		return chromedp.Void{}, err
	}
}
