using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Text.RegularExpressions;
using System.Xml.Linq;

namespace Ticketing.Tools
{
    /// <summary>
    /// Checks src/Ticketing/Ticketing.csproj for what `dotnet pack` puts in the package's .nuspec
    /// (where no .NET SDK can run it): the metadata the registry shows, with the values the
    /// project decided (version from the repository's VERSION, Apache-2.0, the repository URLs),
    /// no deprecated property that makes pack warn, the README and LICENSE packed at the package
    /// root, and that the files the SDK compiles by default are the files the Mono build
    /// compiled (the list library.sh wrote). Run by package.sh (as a program) and by
    /// PackageTests (with build.sh's list).
    /// </summary>
    public static class PackageCheck
    {
        /// <summary>The values every Ticketing package carries.</summary>
        private static readonly Dictionary<string, string> Exact = new Dictionary<string, string>
        {
            { "PackageId", "Ticketing.Client" },
            { "AssemblyName", "Ticketing" },
            { "Authors", "The Ticketing authors" },
            { "PackageLicenseExpression", "Apache-2.0" },
            { "RepositoryUrl", "https://github.com/ticketing/ticketing" },
            { "RepositoryType", "git" },
            { "PackageProjectUrl", "https://github.com/ticketing/ticketing/tree/main/clients/csharp" },
            { "PackageReadmeFile", "README.md" },
        };

        /// <summary>Properties that must be present and not empty.</summary>
        private static readonly string[] Required =
        {
            "TargetFrameworks", "Version", "Description", "PackageTags", "Product",
        };

        /// <summary>Properties that make `dotnet pack` warn (deprecated) or change what the project compiles.</summary>
        private static readonly string[] Forbidden =
        {
            "PackageLicenseUrl", "PackageIconUrl", "PackageLicenseFile", "EnableDefaultItems",
            "EnableDefaultCompileItems", "GenerateAssemblyInfo", "DefineConstants", "TargetFramework",
        };

        /// <summary>Assembly attributes the SDK generates: a second copy in a source fails its build (CS0579).</summary>
        private static readonly Regex GeneratedAttribute = new Regex(
            @"\[\s*assembly\s*:\s*(System\.Reflection\.)?Assembly(Title|Description|Product|Company|Copyright|Configuration|Version|FileVersion|InformationalVersion)(Attribute)?\s*\(");

        /// <summary>Runs the check: <c>PackageCheck.exe CLIENT_DIR REPO_ROOT COMPILED_LIST</c>; prints the package's metadata, or each problem.</summary>
        /// <param name="args">the client's folder, the repository root, the list of the sources Mono compiled</param>
        /// <returns>0 when there is no problem</returns>
        public static int Main(string[] args)
        {
            if (args.Length != 3)
            {
                Console.Error.WriteLine("usage: PackageCheck.exe CLIENT_DIR REPO_ROOT COMPILED_LIST");
                return 2;
            }
            List<string> metadata;
            List<string> problems = Problems(args[0], args[1], args[2], out metadata);
            foreach (string p in problems)
            {
                Console.Error.WriteLine("package check: " + p);
            }
            if (problems.Count > 0)
            {
                return 1;
            }
            foreach (string m in metadata)
            {
                Console.WriteLine(m);
            }
            return 0;
        }

        /// <summary>The problems found (none: ready to pack), and the metadata the .nuspec would carry.</summary>
        /// <param name="clientDir">clients/csharp</param>
        /// <param name="repoRoot">the repository root (VERSION, LICENSE)</param>
        /// <param name="compiledList">the sources Mono compiled, one a line, relative to <paramref name="clientDir"/></param>
        /// <param name="metadata">the package's metadata, "name: value" lines</param>
        /// <returns>the problems, each one line</returns>
        public static List<string> Problems(string clientDir, string repoRoot, string compiledList, out List<string> metadata)
        {
            var problems = new List<string>();
            metadata = new List<string>();
            string projectDir = Path.Combine(clientDir, "src", "Ticketing");
            string csprojPath = Path.Combine(projectDir, "Ticketing.csproj");
            XDocument doc;
            try
            {
                doc = XDocument.Load(csprojPath);
            }
            catch (Exception e)
            {
                problems.Add(csprojPath + " does not parse: " + e.Message);
                return problems;
            }
            XElement project = doc.Root;
            if (project == null || project.Name.LocalName != "Project" || (string)project.Attribute("Sdk") != "Microsoft.NET.Sdk")
            {
                problems.Add("the root element must be <Project Sdk=\"Microsoft.NET.Sdk\">");
                return problems;
            }

            // ---- properties ----
            var props = new Dictionary<string, string>();
            foreach (XElement group in project.Elements("PropertyGroup"))
            {
                if (group.Attribute("Condition") != null)
                {
                    problems.Add("a conditional <PropertyGroup>: the package metadata must not depend on the target framework");
                }
                foreach (XElement p in group.Elements())
                {
                    string name = p.Name.LocalName;
                    if (props.ContainsKey(name))
                    {
                        problems.Add("<" + name + "> is set twice");
                    }
                    props[name] = p.Value.Trim();
                }
            }
            foreach (KeyValuePair<string, string> e in Exact)
            {
                string v;
                if (!props.TryGetValue(e.Key, out v))
                {
                    problems.Add("<" + e.Key + "> is missing (want " + e.Value + ")");
                }
                else if (v != e.Value)
                {
                    problems.Add("<" + e.Key + "> is \"" + v + "\", want \"" + e.Value + "\"");
                }
            }
            foreach (string r in Required)
            {
                string v;
                if (!props.TryGetValue(r, out v) || v.Length == 0)
                {
                    problems.Add("<" + r + "> is missing or empty");
                }
            }
            foreach (string f in Forbidden)
            {
                if (props.ContainsKey(f))
                {
                    problems.Add("<" + f + "> must not be set (deprecated by NuGet, or it changes what is compiled or generated)");
                }
            }
            string version = Get(props, "Version");
            string want = ReadOrNull(Path.Combine(repoRoot, "VERSION"));
            if (want == null)
            {
                problems.Add("cannot read " + Path.Combine(repoRoot, "VERSION"));
            }
            else if (version != want.Trim())
            {
                problems.Add("<Version> is \"" + version + "\", the repository's VERSION says \"" + want.Trim() + "\"");
            }
            string description = Get(props, "Description");
            if (description.Length > 4000 || description.Contains("\n"))
            {
                problems.Add("<Description> must be one line of at most 4000 characters");
            }
            string[] frameworks = Get(props, "TargetFrameworks").Split(new[] { ';' }, StringSplitOptions.RemoveEmptyEntries);
            if (!frameworks.Contains("netstandard2.0"))
            {
                problems.Add("<TargetFrameworks> must include netstandard2.0 (what Mono builds and tests)");
            }
            string[] tags = Get(props, "PackageTags").Split(';');
            if (tags.Any(t => t.Length == 0 || t.Any(char.IsWhiteSpace)))
            {
                problems.Add("<PackageTags> must be ';'-separated tags without spaces");
            }

            // ---- items: no Compile items, README and LICENSE packed at the root ----
            var packed = new Dictionary<string, string>(); // path in the package -> file
            foreach (XElement group in project.Elements("ItemGroup"))
            {
                foreach (XElement item in group.Elements())
                {
                    string kind = item.Name.LocalName;
                    if (kind == "Compile")
                    {
                        problems.Add("a <Compile> item: the project must compile the SDK's default (every *.cs), as build.sh does");
                    }
                    if ((string)item.Attribute("Pack") != "true")
                    {
                        continue;
                    }
                    string include = (string)item.Attribute("Include") ?? "";
                    string file = Path.GetFullPath(Path.Combine(projectDir, include.Replace('\\', '/')));
                    if (!File.Exists(file))
                    {
                        problems.Add("packed <" + kind + " Include=\"" + include + "\"> does not exist (" + file + ")");
                        continue;
                    }
                    string dir = ((string)item.Attribute("PackagePath") ?? "").Trim('/', '\\');
                    packed[(dir.Length == 0 ? "" : dir + "/") + Path.GetFileName(file)] = file;
                }
            }
            string readme;
            if (!packed.TryGetValue(Get(props, "PackageReadmeFile"), out readme))
            {
                problems.Add("the <PackageReadmeFile> " + Get(props, "PackageReadmeFile") + " is not packed at the package root (NU5039)");
            }
            else
            {
                CheckReadme(File.ReadAllText(readme), Get(props, "PackageId"), problems);
            }
            string license;
            if (!packed.TryGetValue("LICENSE", out license))
            {
                problems.Add("LICENSE is not packed at the package root");
            }
            else if (!File.ReadAllBytes(license).SequenceEqual(File.ReadAllBytes(Path.Combine(repoRoot, "LICENSE"))))
            {
                problems.Add(license + " differs from the repository's LICENSE");
            }

            // ---- the sources: the SDK's default set is what Mono compiled ----
            List<string> sdk = SdkCompileItems(projectDir).Select(p => Relative(clientDir, p)).OrderBy(p => p, StringComparer.Ordinal).ToList();
            string listText = ReadOrNull(compiledList);
            if (listText == null)
            {
                problems.Add("cannot read the list of the sources Mono compiled: " + compiledList);
            }
            else
            {
                List<string> mono = listText.Split('\n').Select(l => l.Trim()).Where(l => l.Length > 0)
                    .Select(l => Relative(clientDir, Path.Combine(clientDir, l))).OrderBy(p => p, StringComparer.Ordinal).ToList();
                foreach (string only in sdk.Except(mono))
                {
                    problems.Add(only + " is compiled by the .csproj but not by the Mono build");
                }
                foreach (string only in mono.Except(sdk))
                {
                    problems.Add(only + " is compiled by the Mono build but not by the .csproj");
                }
            }
            foreach (string source in sdk)
            {
                if (GeneratedAttribute.IsMatch(File.ReadAllText(Path.Combine(clientDir, source))))
                {
                    problems.Add(source + " sets an assembly attribute the SDK generates from the .csproj (CS0579 under dotnet build)");
                }
            }

            foreach (string name in new[] { "PackageId", "Version", "Authors", "Description", "PackageLicenseExpression", "PackageProjectUrl", "RepositoryUrl", "RepositoryType", "PackageTags", "PackageReadmeFile", "TargetFrameworks" })
            {
                metadata.Add(name + ": " + Get(props, name));
            }
            metadata.Add("packed: " + string.Join(", ", packed.Keys.OrderBy(k => k, StringComparer.Ordinal)));
            metadata.Add("compiles: " + sdk.Count + " sources, the same as the Mono build");
            return problems;
        }

        /// <summary>The packed README is shown by the registry, away from the repository: no relative links, and it says how to install.</summary>
        private static void CheckReadme(string text, string packageId, List<string> problems)
        {
            foreach (Match m in Regex.Matches(text, @"\]\((?!https?://|#)([^)]*)\)"))
            {
                problems.Add("README.md links to " + m.Groups[1].Value + ": a relative link is broken in the package; link the repository (https://github.com/ticketing/ticketing/...)");
            }
            if (!Regex.IsMatch(text, @"^## Install\s*$", RegexOptions.Multiline))
            {
                problems.Add("README.md has no \"## Install\" section");
            }
            if (!text.Contains("dotnet add package " + packageId))
            {
                problems.Add("README.md does not say `dotnet add package " + packageId + "`");
            }
        }

        /// <summary>
        /// What the .NET SDK compiles by default (EnableDefaultCompileItems): **/*.cs under the
        /// project folder, except bin/**, obj/** and hidden folders (**/.*/**).
        /// </summary>
        private static IEnumerable<string> SdkCompileItems(string projectDir)
        {
            var pending = new Stack<string>();
            pending.Push(projectDir);
            while (pending.Count > 0)
            {
                string dir = pending.Pop();
                foreach (string sub in Directory.GetDirectories(dir))
                {
                    string name = Path.GetFileName(sub);
                    bool top = dir == projectDir;
                    if (name.StartsWith(".", StringComparison.Ordinal) || (top && (name == "bin" || name == "obj")))
                    {
                        continue;
                    }
                    pending.Push(sub);
                }
                foreach (string f in Directory.GetFiles(dir, "*.cs"))
                {
                    yield return f;
                }
            }
        }

        private static string Relative(string baseDir, string path)
        {
            string b = Path.GetFullPath(baseDir).TrimEnd('/') + "/";
            string p = Path.GetFullPath(path);
            return p.StartsWith(b, StringComparison.Ordinal) ? p.Substring(b.Length) : p;
        }

        private static string Get(Dictionary<string, string> props, string name)
        {
            string v;
            return props.TryGetValue(name, out v) ? v : "";
        }

        private static string ReadOrNull(string path)
        {
            try
            {
                return File.ReadAllText(path);
            }
            catch (IOException)
            {
                return null;
            }
            catch (UnauthorizedAccessException)
            {
                return null;
            }
        }
    }
}
