// Package browser tests the dashboard (R-API5) in a real headless Chromium,
// driven with chromedp, against a fusebox started in-process. It is its own
// module so that chromedp stays out of fusebox's go.mod. Outside CI the test
// skips when chromium is absent; with CI=true it must run.
package browser
