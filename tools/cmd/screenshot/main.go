// Command screenshot saves a full-page PNG screenshot of a page as chromium renders it, such
// as the status page of a running `make run`:
//
//	cd tools && go run ./cmd/screenshot -url 'http://127.0.0.1:9816/status?refresh=0' -out ../docs/status.png
//
// With basic auth, the password is read from the file -password-file names.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pg-liveness/pg_liveness_exporter/tools/browser"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:9816/status?refresh=0", "page to capture (loopback only)")
	out := flag.String("out", "status.png", "PNG file to write")
	user := flag.String("user", "", "basic-auth user")
	passwordFile := flag.String("password-file", "", "file holding the basic-auth password")
	wait := flag.Duration("wait", time.Second, "wait after the page loaded, so that its script has run")
	flag.Parse()
	if err := run(*url, *out, *user, *passwordFile, *wait); err != nil {
		fmt.Fprintln(os.Stderr, "screenshot:", err)
		os.Exit(1)
	}
}

func run(url, out, user, passwordFile string, wait time.Duration) error {
	ctx, cancel, err := browser.Start(context.Background())
	if err != nil {
		return err
	}
	defer cancel()
	tctx, cancelT := context.WithTimeout(ctx, time.Minute)
	defer cancelT()
	if user != "" {
		pw, err := os.ReadFile(passwordFile)
		if err != nil {
			return err
		}
		if err := chromedp.Do(tctx, browser.BasicAuth(user, strings.TrimSpace(string(pw)))); err != nil {
			return err
		}
	}
	res, err := chromedp.Run(tctx, chromedp.NavigateResponse(url))
	if err != nil {
		return err
	}
	if res.Status != 200 {
		return fmt.Errorf("%s: HTTP %d", url, res.Status)
	}
	if err := chromedp.Do(tctx, chromedp.Sleep(wait)); err != nil {
		return err
	}
	png, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
	if err != nil {
		return err
	}
	return os.WriteFile(out, png, 0o644)
}
