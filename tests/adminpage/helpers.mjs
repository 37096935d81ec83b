// Shared by the admin page tests (page.test.mjs, follower.test.mjs).
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium } from "playwright-core";

// stop sends SIGTERM to a child it started and waits for its exit (SIGKILL after 10 s).
export function stop(child) {
  return new Promise((resolve) => {
    if (!child || child.exitCode !== null || child.signalCode !== null) return resolve();
    const timer = setTimeout(() => child.kill("SIGKILL"), 10000);
    child.once("exit", () => { clearTimeout(timer); resolve(); });
    process.kill(child.pid, "SIGTERM");
  });
}

// launchBrowser starts Debian's headless Chromium with a fresh profile directory (returned, for
// the caller to remove): playwright passes --user-data-dir itself.
export async function launchBrowser(height) {
  const profile = mkdtempSync(join(tmpdir(), "chromium-profile-"));
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: "/usr/bin/chromium",
    headless: true,
    viewport: { width: 1280, height },
    args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
  return { browser, profile };
}
