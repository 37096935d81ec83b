# frozen_string_literal: true

require "open3"
require "rbconfig"
require_relative "server_helper"

# The README's first example runs, as written, against a real server.
class ReadmeTest < Minitest::Test
  def test_example_is_short_and_runs_as_written
    code = TestHelper.readme_example
    refute_nil code
    assert_operator code.lines.size, :<=, 10
    server = TicketingServer.new
    begin
      out, err, status = Open3.capture3({ "TICKETING_ENDPOINT" => server.endpoint }, RbConfig.ruby,
                                        "-I", File.expand_path("../lib", __dir__), "-e", code)
      assert status.success?, err
      token = out[/holding order-1234 with fencing token (\d+)/, 1]
      refute_nil token, out
      check = Ticketing::Client.open(endpoints: [server.endpoint]) { |c| c.inspect_key("order-1234") }
      refute check.held?, "released at the end of the block"
    ensure
      server.close
    end
  end
end
