using System;
using System.Collections;
using System.Collections.Generic;
using System.Globalization;
using System.Text;

namespace Ticketing.Conformance
{
    /// <summary>
    /// A small JSON reader and writer for the driver's line protocol and the tests' vector files:
    /// objects become <see cref="Dictionary{TKey, TValue}"/>, arrays <see cref="List{T}"/>, integers
    /// <see cref="long"/> (else <see cref="double"/>), plus string, bool and null.
    /// </summary>
    internal static class Json
    {
        internal static object Parse(string text)
        {
            int at = 0;
            object v = Value(text, ref at);
            Skip(text, ref at);
            if (at != text.Length)
            {
                throw new FormatException("JSON: trailing characters at " + at);
            }
            return v;
        }

        private static void Skip(string s, ref int at)
        {
            while (at < s.Length && char.IsWhiteSpace(s[at]))
            {
                at++;
            }
        }

        private static object Value(string s, ref int at)
        {
            Skip(s, ref at);
            if (at >= s.Length)
            {
                throw new FormatException("JSON: unexpected end");
            }
            char c = s[at];
            if (c == '{')
            {
                at++;
                var o = new Dictionary<string, object>();
                Skip(s, ref at);
                if (at < s.Length && s[at] == '}')
                {
                    at++;
                    return o;
                }
                while (true)
                {
                    Skip(s, ref at);
                    string k = Str(s, ref at);
                    Skip(s, ref at);
                    Expect(s, ref at, ':');
                    o[k] = Value(s, ref at);
                    Skip(s, ref at);
                    if (at < s.Length && s[at] == ',')
                    {
                        at++;
                        continue;
                    }
                    Expect(s, ref at, '}');
                    return o;
                }
            }
            if (c == '[')
            {
                at++;
                var a = new List<object>();
                Skip(s, ref at);
                if (at < s.Length && s[at] == ']')
                {
                    at++;
                    return a;
                }
                while (true)
                {
                    a.Add(Value(s, ref at));
                    Skip(s, ref at);
                    if (at < s.Length && s[at] == ',')
                    {
                        at++;
                        continue;
                    }
                    Expect(s, ref at, ']');
                    return a;
                }
            }
            if (c == '"')
            {
                return Str(s, ref at);
            }
            if (Word(s, ref at, "true"))
            {
                return true;
            }
            if (Word(s, ref at, "false"))
            {
                return false;
            }
            if (Word(s, ref at, "null"))
            {
                return null;
            }
            int start = at;
            while (at < s.Length && "+-0123456789.eE".IndexOf(s[at]) >= 0)
            {
                at++;
            }
            string num = s.Substring(start, at - start);
            if (num.Length == 0)
            {
                throw new FormatException("JSON: unexpected '" + c + "' at " + start);
            }
            long l;
            if (long.TryParse(num, NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out l))
            {
                return l;
            }
            return double.Parse(num, NumberStyles.Float, CultureInfo.InvariantCulture);
        }

        private static bool Word(string s, ref int at, string w)
        {
            if (string.CompareOrdinal(s, at, w, 0, w.Length) == 0)
            {
                at += w.Length;
                return true;
            }
            return false;
        }

        private static void Expect(string s, ref int at, char c)
        {
            if (at >= s.Length || s[at] != c)
            {
                throw new FormatException("JSON: expected '" + c + "' at " + at);
            }
            at++;
        }

        private static string Str(string s, ref int at)
        {
            Expect(s, ref at, '"');
            var sb = new StringBuilder();
            while (true)
            {
                if (at >= s.Length)
                {
                    throw new FormatException("JSON: unterminated string");
                }
                char c = s[at++];
                if (c == '"')
                {
                    return sb.ToString();
                }
                if (c != '\\')
                {
                    sb.Append(c);
                    continue;
                }
                char e = s[at++];
                switch (e)
                {
                    case 'n': sb.Append('\n'); break;
                    case 't': sb.Append('\t'); break;
                    case 'r': sb.Append('\r'); break;
                    case 'b': sb.Append('\b'); break;
                    case 'f': sb.Append('\f'); break;
                    case 'u':
                        sb.Append((char)int.Parse(s.Substring(at, 4), NumberStyles.HexNumber, CultureInfo.InvariantCulture));
                        at += 4;
                        break;
                    default: sb.Append(e); break;
                }
            }
        }

        internal static string Write(object v)
        {
            var sb = new StringBuilder();
            Write(sb, v);
            return sb.ToString();
        }

        private static void Write(StringBuilder sb, object v)
        {
            if (v == null)
            {
                sb.Append("null");
            }
            else if (v is string)
            {
                sb.Append('"');
                foreach (char c in (string)v)
                {
                    switch (c)
                    {
                        case '"': sb.Append("\\\""); break;
                        case '\\': sb.Append("\\\\"); break;
                        case '\n': sb.Append("\\n"); break;
                        case '\r': sb.Append("\\r"); break;
                        case '\t': sb.Append("\\t"); break;
                        default:
                            if (c < 0x20)
                            {
                                sb.Append("\\u").Append(((int)c).ToString("x4"));
                            }
                            else
                            {
                                sb.Append(c);
                            }
                            break;
                    }
                }
                sb.Append('"');
            }
            else if (v is bool)
            {
                sb.Append((bool)v ? "true" : "false");
            }
            else if (v is IDictionary)
            {
                sb.Append('{');
                bool first = true;
                foreach (DictionaryEntry e in (IDictionary)v)
                {
                    if (!first)
                    {
                        sb.Append(',');
                    }
                    first = false;
                    Write(sb, e.Key.ToString());
                    sb.Append(':');
                    Write(sb, e.Value);
                }
                sb.Append('}');
            }
            else if (v is IEnumerable)
            {
                sb.Append('[');
                bool first = true;
                foreach (object o in (IEnumerable)v)
                {
                    if (!first)
                    {
                        sb.Append(',');
                    }
                    first = false;
                    Write(sb, o);
                }
                sb.Append(']');
            }
            else if (v is IFormattable)
            {
                sb.Append(((IFormattable)v).ToString(null, CultureInfo.InvariantCulture));
            }
            else
            {
                Write(sb, v.ToString());
            }
        }
    }
}
