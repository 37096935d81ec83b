// A follower's admin page (issue 30, defect 7), in real headless Chromium: a 3-node cluster of
// real servers (TICKETING_BIN) on 127.0.0.1, the fixture's traffic (FIXTURE_BIN) on the leader,
// and the page of a follower, which serves no clients. It must say that it is a follower and
// name the leader with a link to the leader's admin page, chart the grants it applies from the
// leader's log (not its own operations, which are 0), and show holders as connected through the
// leader, not "detached". Run by test.sh.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { launchBrowser, stop } from "./helpers.mjs";

const BIN = process.env.TICKETING_BIN;
const FIXTURE = process.env.FIXTURE_BIN;
const ARTIFACTS = process.env.ARTIFACTS || ".";
assert.ok(BIN && FIXTURE, "TICKETING_BIN and FIXTURE_BIN must be set (run test.sh)");

const nodes = []; // { id, addr, admin, raft, proc, dir, log }
let fixture, browser, profile;

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function portFree(port) {
  return new Promise((resolve) => {
    const s = createServer();
    s.once("error", () => resolve(false));
    s.listen(port, "127.0.0.1", () => s.close(() => resolve(true)));
  });
}

// threePorts finds p with p, p+1, p+2 free (client, admin = client + 1, Raft), away from the
// ports already chosen and below the usual ephemeral range (bounded tries).
async function threePorts(taken) {
  for (let i = 0; i < 200; i++) {
    const p = 20000 + Math.floor(Math.random() * 12000);
    if (taken.some((q) => Math.abs(p - q) < 3)) continue;
    if ((await portFree(p)) && (await portFree(p + 1)) && (await portFree(p + 2))) return p;
  }
  throw new Error("no three free ports in a row");
}

async function getJSON(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error(url + ": " + r.status);
  return r.json();
}

// leader polls the nodes' /cluster/status until one leads and serves (bounded).
async function leader(ms) {
  for (const until = Date.now() + ms; Date.now() < until; await sleep(200)) {
    for (const n of nodes) {
      try {
        const st = await getJSON("http://" + n.admin + "/cluster/status");
        if (st.role === "leader" && st.serving) return n;
      } catch { /* not up yet */ }
    }
  }
  throw new Error("no leader within " + ms + " ms:\n" + nodes.map((n) => n.id + ":\n" + n.log.slice(-15).join("\n")).join("\n"));
}

before(async () => {
  const taken = [];
  for (let i = 1; i <= 3; i++) {
    const p = await threePorts(taken);
    taken.push(p);
    nodes.push({ id: "n" + i, addr: "127.0.0.1:" + p, admin: "127.0.0.1:" + (p + 1), raft: "127.0.0.1:" + (p + 2), log: [] });
  }
  const peers = nodes.map((n) => n.id + "=" + n.raft).join(",");
  for (const n of nodes) {
    n.dir = mkdtempSync(join(tmpdir(), "ticketing-adminpage-" + n.id + "-"));
    // Timing 3: a 2-core test machine under load must not change leaders mid-test (the fixture does
    // not follow a leader change).
    const env = Object.assign({}, process.env, { TICKETING_RAFT_TIMING: "3", TICKETING_CLUSTER_SECRET: "adminpage-test", TICKETING_ADMIN_ADDR: "", TICKETING_TOKEN: "", TICKETING_TOKEN_FILE: "" });
    n.proc = spawn(BIN, ["server", "--addr", n.addr, "--node-id", n.id, "--peers", peers, "--data-dir", n.dir], { stdio: ["ignore", "ignore", "pipe"], env });
    createInterface({ input: n.proc.stderr }).on("line", (l) => n.log.push(l));
  }
  const lead = await leader(40000);
  fixture = spawn(FIXTURE, [lead.addr], { stdio: ["ignore", "pipe", "inherit"] });
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error("fixture not ready within 30 s")), 30000);
    createInterface({ input: fixture.stdout }).on("line", (l) => { if (l === "ready") { clearTimeout(timer); resolve(); } });
  });
  ({ browser, profile } = await launchBrowser(1800));
});

after(async () => {
  if (browser) await browser.close();
  await stop(fixture);
  for (const n of nodes) await stop(n.proc);
  for (const d of [...nodes.map((n) => n.dir), profile]) if (d) rmSync(d, { recursive: true, force: true });
});

test("a follower's admin page says it is a follower, names the leader, and shows the cluster's traffic", { timeout: 90000 }, async () => {
  const lead = await leader(10000);
  const follower = nodes.find((n) => n !== lead);
  const page = await browser.newPage();
  const pageErrors = [];
  page.on("pageerror", (e) => pageErrors.push(String(e)));
  await page.goto("http://" + follower.admin + "/");

  // The banner: a follower, the leader by id and client address, a link to its admin page.
  const banner = page.locator("#role-banner");
  await banner.waitFor({ state: "visible", timeout: 10000 });
  const text = await banner.textContent();
  assert.match(text, new RegExp("This node \\(" + follower.id + "\\) is a follower\\."));
  assert.ok(text.includes("the leader " + lead.id + " (client address " + lead.addr + ")"), text);
  assert.equal(await page.locator("#leader-link").getAttribute("href"), "http://" + lead.admin + "/");

  // The first card is labelled as this node's own operations; the chart is the grants applied.
  assert.match(await page.locator("#label-ops").textContent(), /operations\/s here \(clients use the leader\)/);
  assert.match(await page.locator("#caption-ops").textContent(), /^Grants applied from the leader's log/);
  await page.waitForFunction(() => parseFloat(document.getElementById("rate-grants").textContent) > 0, null, { timeout: 15000 });
  await page.waitForFunction(() => {
    const c = document.getElementById("chart-ops");
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let blue = 0;
    for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 0 && d[i + 2] > d[i] + 80 && d[i + 2] > d[i + 1] + 40) blue++;
    return blue > 20;
  }, null, { timeout: 15000 });
  // The line is not flat at 0: its highest point is well above the chart's floor.
  const top = await page.evaluate(() => {
    const c = document.getElementById("chart-ops");
    const d = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
    let minY = c.height;
    for (let i = 0; i < d.length; i += 4) {
      if (d[i + 3] > 0 && d[i + 2] > d[i] + 80 && d[i + 2] > d[i + 1] + 40) minY = Math.min(minY, Math.floor(i / 4 / c.width));
    }
    return { minY, h: c.height };
  });
  assert.ok(top.minY < top.h - 30, `the grants line is flat at the bottom: highest point y=${top.minY} of ${top.h}`);

  // Held locks: the holder is connected through the leader, not "detached".
  const row1001 = page.locator('#locks-table tr[data-key="orders:1001"]');
  await row1001.waitFor({ timeout: 10000 });
  assert.equal(await row1001.locator("td.waiting").textContent(), "2");
  const holder = await row1001.locator("td").nth(5).textContent();
  if (holder !== "via leader") {
    const key = await (await fetch("http://" + follower.admin + "/api/key?key=orders:1001")).text();
    assert.fail(`the holder on the follower's page: ${JSON.stringify(holder)}, want "via leader"; the follower's /api/key: ${key}\n` +
      nodes.map((n) => n.id + ":\n" + n.log.filter((l) => !/component=raft/.test(l)).slice(-8).join("\n")).join("\n"));
  }
  await row1001.locator("td.key").click();
  const waiters = page.locator("#waiters-table tbody tr");
  await waiters.nth(1).waitFor({ timeout: 10000 });
  assert.equal(await waiters.nth(0).locator("td").nth(2).textContent(), "via leader");
  assert.match(await page.locator("#key-detail").textContent(), /\(via leader\)/);

  // The most contended keys are the cluster's too (a follower applies the same queueing).
  const top1001 = page.locator('#top-table tr[data-key="orders:1001"]');
  await top1001.waitFor({ timeout: 10000 });
  assert.equal(await top1001.locator("td").nth(1).textContent(), "2");
  await page.screenshot({ path: join(ARTIFACTS, "admin-page-follower.png"), fullPage: true });

  // The leader's own page has no banner and charts operations.
  await page.goto("http://" + lead.admin + "/");
  await page.locator("#locks-table tr[data-key=\"orders:1001\"]").waitFor({ timeout: 10000 });
  assert.equal(await page.locator("#role-banner").isVisible(), false);
  assert.match(await page.locator("#caption-ops").textContent(), /^Throughput \(operations\/s/);
  assert.match(await page.locator('#locks-table tr[data-key="orders:1001"] td >> nth=5').textContent(), /^127\.0\.0\.1:\d+$/);
  assert.deepEqual(pageErrors, []);
  await page.close();
});
