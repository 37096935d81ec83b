# frozen_string_literal: true

require "open3"
require "rbconfig"
require "rubygems/package"
require_relative "server_helper"

# The gem as it would be published: built by package.sh (test.sh passes its artifact in
# $TICKETING_GEM; run alone, the test builds one), installed offline into a fresh GEM_HOME, and
# the README's example run, as written, from a fresh folder with only that GEM_HOME: the library
# must come from the installed gem, never from this checkout.
class PackageTest < Minitest::Test
  HERE = File.expand_path("..", __dir__)

  def setup
    @tmp = Dir.mktmpdir("ruby-package")
  end

  def teardown
    FileUtils.rm_rf(@tmp)
  end

  def gem_file
    file = ENV["TICKETING_GEM"].to_s
    return file unless file.empty?

    out, err, status = Open3.capture3(File.join(HERE, "package.sh"), File.join(@tmp, "dist"))
    assert status.success?, "package.sh failed:\n#{err}"
    out.lines.last.chomp
  end

  # Only RubyGems' own variables for the child: no RUBYLIB/RUBYOPT (bundler sets them) that
  # could put this checkout's lib/ on the load path.
  def gem_env(home)
    { "GEM_HOME" => home, "GEM_PATH" => home, "RUBYLIB" => nil, "RUBYOPT" => nil, "BUNDLE_GEMFILE" => nil }
  end

  def test_version_is_the_repository_version
    assert_equal File.read(File.join(TestHelper::REPO_ROOT, "VERSION")).strip, Ticketing::VERSION
  end

  def test_gem_installs_offline_and_runs_the_readme_example
    gem = gem_file
    spec = Gem::Package.new(gem).spec
    assert_equal ["ticketing", Ticketing::VERSION, "Apache-2.0"], [spec.name, spec.version.to_s, spec.license]
    assert_empty spec.files.grep_v(%r{\A(lib/.+\.rb|README\.md|LICENSE)\z}), "only lib/, README.md and LICENSE"

    home = File.join(@tmp, "gems")
    _, err, status = Open3.capture3(gem_env(home), RbConfig.ruby, "-S", "gem", "install", "--local",
                                    "--no-document", "--install-dir", home, gem)
    assert status.success?, "gem install --local failed:\n#{err}"

    app = File.join(@tmp, "app")
    FileUtils.mkdir_p(app)
    File.write(File.join(app, "example.rb"), TestHelper.readme_example)
    # Says, at exit, which file `require "ticketing"` loaded.
    File.write(File.join(app, "origin.rb"),
               %(at_exit { warn "ticketing from \#{$LOADED_FEATURES.find { |f| f.end_with?("/ticketing.rb") }}" }\n))
    server = TicketingServer.new
    begin
      out, err, status = Open3.capture3(gem_env(home).merge("TICKETING_ENDPOINT" => server.endpoint),
                                        RbConfig.ruby, "-r./origin", "example.rb", chdir: app)
      assert status.success?, err
      assert_match(/holding order-1234 with fencing token \d+/, out)
      assert_equal "ticketing from #{home}/gems/ticketing-#{Ticketing::VERSION}/lib/ticketing.rb",
                   err[/^ticketing from .*/], err
    ensure
      server.close
    end
  end
end
