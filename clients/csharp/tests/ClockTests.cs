using System;
using System.Diagnostics;
using System.Globalization;
using System.IO;
using NUnit.Framework;

namespace Ticketing.Tests
{
    /// <summary>The clock of lock deadlines: it counts the time the host is suspended (PROTOCOL.md, "The lost signal").</summary>
    [TestFixture]
    public class ClockTests
    {
        private static readonly long Second = Clock.FromMs(1000);

        [Test]
        public void TheFallbackCountsTheWallClocksLargerAdvanceOnly()
        {
            long mono = 0;
            long wall = DateTime.UtcNow.Ticks;
            var w = new WallSource(() => mono, () => wall);
            mono += Second;
            wall += TimeSpan.TicksPerSecond;
            Assert.AreEqual(0, w.Suspended(), "both advance alike");
            mono += Second;
            wall += 30 * TimeSpan.TicksPerSecond;
            Assert.AreEqual(29 * Second, w.Suspended(), "a suspend: the wall clock ran ahead");
            mono += Second;
            wall -= 60 * TimeSpan.TicksPerSecond;
            Assert.AreEqual(29 * Second, w.Suspended(), "the wall clock stepped back: ignored");
            mono += Second;
            wall += TimeSpan.TicksPerSecond;
            Assert.AreEqual(29 * Second, w.Suspended(), "and counted from where it stands now");
        }

        [Test]
        public void TheClockAddsTheSuspendTimeAndNeverGoesBack()
        {
            long wall = DateTime.UtcNow.Ticks;
            var clock = new SuspendClock(new WallSource(Stopwatch.GetTimestamp, () => wall));
            long before = clock.ExactNow;
            wall += 30 * TimeSpan.TicksPerSecond;
            long after = clock.ExactNow;
            Assert.That(after - before, Is.InRange(30 * Second - Second / 1000, 31 * Second), "a 30 s wall clock jump between two reads");
            Assert.GreaterOrEqual(clock.Now, after, "the cheap read includes it");
            wall -= 60 * TimeSpan.TicksPerSecond;
            Assert.GreaterOrEqual(clock.ExactNow, after, "a wall clock stepped back never takes the clock back");
        }

        /// <summary>
        /// On Linux the clock reads CLOCK_BOOTTIME: inside a time namespace whose boottime is
        /// 100,000 s ahead of its monotonic clock (what a long suspend looks like), the raw reading
        /// agrees with /proc/uptime (BOOTTIME there). The check runs in a child nunit-console.
        /// </summary>
        [Test]
        public void OnLinuxTheClockReadsBoottime()
        {
            if (Environment.GetEnvironmentVariable("TICKETING_CLOCK_CHILD") == "1")
            {
                long ns;
                Assert.IsTrue(BootTimeSource.Boottime(out ns), "clock_gettime(CLOCK_BOOTTIME) failed");
                double up = double.Parse(File.ReadAllText("/proc/uptime").Split(' ')[0], CultureInfo.InvariantCulture);
                Assert.That(ns / 1e9, Is.EqualTo(up).Within(1.0), "BOOTTIME against /proc/uptime");
                Assert.Greater(ns / 1e9, 100000.0, "the namespace's boottime offset");
                Assert.IsNotNull(BootTimeSource.TryCreate(), "the clock's source is BOOTTIME here");
                return;
            }
            if (!File.Exists("/proc/uptime"))
            {
                Assert.IsNull(BootTimeSource.TryCreate(), "CLOCK_BOOTTIME outside Linux");
                return;
            }
            string refused = Run("unshare", "--time --fork --boottime 100000 true", false);
            if (refused != null)
            {
                Console.WriteLine("OnLinuxTheClockReadsBoottime: skipped, unshare --time is refused here: " + refused.Trim());
                return;
            }
            string failed = Run("unshare", "--time --fork --boottime 100000 nunit-console -nologo -noresult -noshadow"
                + " -run=" + typeof(ClockTests).FullName + "." + nameof(OnLinuxTheClockReadsBoottime)
                + " \"" + typeof(ClockTests).Assembly.Location + "\"", true);
            Assert.IsNull(failed, "in a time namespace with boottime +100000 s");
        }

        /// <summary>Runs a command; null when it exits 0, else its output.</summary>
        private static string Run(string file, string args, bool child)
        {
            var psi = new ProcessStartInfo(file, args)
            {
                UseShellExecute = false,
                RedirectStandardOutput = true,
                RedirectStandardError = true,
            };
            if (child)
            {
                psi.EnvironmentVariables["TICKETING_CLOCK_CHILD"] = "1";
            }
            try
            {
                using (Process p = Process.Start(psi))
                {
                    var stderr = p.StandardError.ReadToEndAsync();
                    string output = p.StandardOutput.ReadToEnd();
                    p.WaitForExit();
                    return p.ExitCode == 0 ? null : output + stderr.Result;
                }
            }
            catch (System.ComponentModel.Win32Exception e)
            {
                return file + ": " + e.Message; // not installed
            }
        }
    }
}
