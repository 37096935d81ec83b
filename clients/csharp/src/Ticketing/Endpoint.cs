using System;
using System.Globalization;

namespace Ticketing
{
    /// <summary>A server address, <c>host:port</c> or <c>[v6]:port</c>.</summary>
    internal sealed class Endpoint : IEquatable<Endpoint>
    {
        private Endpoint(string host, int port)
        {
            Host = host;
            Port = port;
        }

        internal string Host { get; }

        internal int Port { get; }

        internal static Endpoint Parse(string text)
        {
            if (text == null)
            {
                throw new ArgumentNullException("endpoint", "endpoint must be host:port, got null");
            }
            string s = text.Trim();
            string host;
            string port;
            if (s.StartsWith("[", StringComparison.Ordinal))
            {
                int close = s.IndexOf(']');
                if (close < 0 || close + 1 >= s.Length || s[close + 1] != ':')
                {
                    throw new ArgumentException("endpoint must be host:port or [v6]:port, got \"" + text + "\"", "endpoint");
                }
                host = s.Substring(1, close - 1);
                port = s.Substring(close + 2);
            }
            else
            {
                int colon = s.LastIndexOf(':');
                if (colon < 0 || s.IndexOf(':') != colon)
                {
                    throw new ArgumentException("endpoint must be host:port (IPv6 as [addr]:port), got \"" + text + "\"", "endpoint");
                }
                host = s.Substring(0, colon);
                port = s.Substring(colon + 1);
            }
            int p;
            if (host.Length == 0 || !int.TryParse(port, NumberStyles.None, CultureInfo.InvariantCulture, out p) || p < 1 || p > 65535)
            {
                throw new ArgumentException("endpoint must be host:port with a port in 1..65535, got \"" + text + "\"", "endpoint");
            }
            return new Endpoint(host, p);
        }

        public bool Equals(Endpoint other)
        {
            return other != null && other.Port == Port && string.Equals(other.Host, Host, StringComparison.OrdinalIgnoreCase);
        }

        public override bool Equals(object obj)
        {
            return Equals(obj as Endpoint);
        }

        public override int GetHashCode()
        {
            return StringComparer.OrdinalIgnoreCase.GetHashCode(Host) * 31 + Port;
        }

        public override string ToString()
        {
            return Host.IndexOf(':') >= 0 ? "[" + Host + "]:" + Port : Host + ":" + Port;
        }
    }
}
