using System;
using System.Text;
using Ticketing.Protocol;

namespace Ticketing
{
    /// <summary>Argument checks, made before anything is sent, and the text forms used in messages.</summary>
    internal static class Args
    {
        private static readonly UTF8Encoding StrictUtf8 = new UTF8Encoding(false, true);

        internal static byte[] Key(string key, string name = "key")
        {
            if (key == null)
            {
                throw new ArgumentNullException(name, "key must be a non-empty string, got null");
            }
            if (key.Length == 0)
            {
                throw new ArgumentException("key must be non-empty", name);
            }
            byte[] b;
            try
            {
                b = StrictUtf8.GetBytes(key);
            }
            catch (EncoderFallbackException)
            {
                throw new ArgumentException("key is not valid Unicode (a lone surrogate); pass the bytes instead", name);
            }
            return CheckLength(b, name);
        }

        internal static byte[] Key(byte[] key, string name = "key")
        {
            if (key == null)
            {
                throw new ArgumentNullException(name, "key must be non-empty bytes, got null");
            }
            if (key.Length == 0)
            {
                throw new ArgumentException("key must be non-empty", name);
            }
            return CheckLength((byte[])key.Clone(), name);
        }

        private static byte[] CheckLength(byte[] b, string name)
        {
            if (b.Length > Wire.MaxKeyLen)
            {
                throw new ArgumentException("key must be at most " + Wire.MaxKeyLen + " bytes, got " + b.Length, name);
            }
            return b;
        }

        /// <summary>A lease in whole milliseconds: at least 1 ms, below 2^32 ms.</summary>
        internal static uint LeaseMs(TimeSpan lease, string name = "lease")
        {
            if (lease.Ticks < TimeSpan.TicksPerMillisecond)
            {
                throw new ArgumentOutOfRangeException(name, lease, "lease must be at least 1 ms (a TimeSpan, e.g. TimeSpan.FromSeconds(30)), got " + Describe(lease));
            }
            long ms = lease.Ticks / TimeSpan.TicksPerMillisecond;
            if (ms > uint.MaxValue)
            {
                throw new ArgumentOutOfRangeException(name, lease, "lease must be below 2^32 ms (about 49.7 days), got " + Describe(lease));
            }
            return (uint)ms;
        }

        /// <summary>
        /// A wait timeout in milliseconds: null, <see cref="System.Threading.Timeout.InfiniteTimeSpan"/>
        /// or 2^32 - 1 ms and more wait without limit; zero tries once; other negatives are rejected.
        /// </summary>
        internal static uint WaitMs(TimeSpan? wait, string name = "waitTimeout")
        {
            if (wait == null || wait.Value == System.Threading.Timeout.InfiniteTimeSpan)
            {
                return Wire.WaitForever;
            }
            if (wait.Value.Ticks < 0)
            {
                throw new ArgumentOutOfRangeException(name, wait.Value, "wait timeout must be >= 0 (or null to wait without limit), got " + Describe(wait.Value));
            }
            long ms = wait.Value.Ticks / TimeSpan.TicksPerMillisecond;
            return ms >= Wire.WaitForever ? Wire.WaitForever : (uint)ms;
        }

        internal static ulong Token(ulong token, string name = "token")
        {
            if (token == 0)
            {
                throw new ArgumentOutOfRangeException(name, token, "token must be a positive 64-bit value, got 0");
            }
            return token;
        }

        internal static string Describe(TimeSpan t)
        {
            return t.TotalMilliseconds.ToString("0.###", System.Globalization.CultureInfo.InvariantCulture) + " ms";
        }

        /// <summary>How much of a key a message shows, in bytes (as the Go client).</summary>
        internal const int MaxKeyInMessage = 64;

        /// <summary>
        /// The key for messages: quoted text when it is valid UTF-8 without control characters,
        /// else <c>0x</c> and hex; a key longer than 64 bytes is cut (never inside a character),
        /// followed by its length: <c>"aaaa…"…(300 bytes)</c>.
        /// </summary>
        internal static string Printable(byte[] key)
        {
            int n = Math.Min(key.Length, MaxKeyInMessage);
            string suffix = n < key.Length ? "\u2026(" + key.Length + " bytes)" : "";
            string text = null;
            try
            {
                text = StrictUtf8.GetString(key);
                foreach (char c in text)
                {
                    if (char.IsControl(c))
                    {
                        text = null;
                        break;
                    }
                }
            }
            catch (DecoderFallbackException)
            {
                text = null;
            }
            if (text == null)
            {
                var sb = new StringBuilder(2 + 2 * n);
                sb.Append("0x");
                for (int i = 0; i < n; i++)
                {
                    sb.Append(key[i].ToString("x2"));
                }
                return sb.Append(suffix).ToString();
            }
            if (n < key.Length)
            {
                while (n > MaxKeyInMessage - 3 && (key[n] & 0xC0) == 0x80)
                {
                    n--; // do not split a character: key[n] continues the one before
                }
                text = StrictUtf8.GetString(key, 0, n);
            }
            return "\"" + text + "\"" + suffix;
        }

        /// <summary>The key decoded leniently (what <c>TicketingLock.Key</c> shows for a binary key).</summary>
        internal static string Text(byte[] key)
        {
            try
            {
                return StrictUtf8.GetString(key);
            }
            catch (DecoderFallbackException)
            {
                return "0x" + Hex(key);
            }
        }

        internal static string Utf8(byte[] data)
        {
            return data == null || data.Length == 0 ? "" : Encoding.UTF8.GetString(data);
        }

        internal static string Hex(byte[] b)
        {
            var sb = new StringBuilder(b.Length * 2);
            int n = Math.Min(b.Length, 64);
            for (int i = 0; i < n; i++)
            {
                sb.Append(b[i].ToString("x2"));
            }
            if (n < b.Length)
            {
                sb.Append("...");
            }
            return sb.ToString();
        }
    }
}
