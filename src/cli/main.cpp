// The `resnet` command: one subcommand per task. Errors from the library (rn::Error)
// are printed as one clear line and exit with status 1.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/build_info.h"
#include "core/check.h"
#include "core/edit_distance.h"
#include "train/versions.h"

namespace {

// The first word was not a command: name it, the commands, and the nearest one.
void say_unknown_command(const CLI::App& app, const std::string& word) {
  std::string names, nearest;
  size_t best = 3;  // at most two edits away
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    if (const size_t d = rn::edit_distance(word, sub->get_name()); d < best) best = d, nearest = sub->get_name();
  }
  fmt::print(stderr, "resnet: '{}' is not a command{}; the commands are {} (resnet --help)\n", word,
             nearest.empty() ? "" : fmt::format(" (did you mean '{}'?)", nearest), names);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"resnet.cpp: train ResNet image classifiers fast on CPUs and NVIDIA GPUs"};
  app.require_subcommand(1);
  app.set_version_flag(
      "--version",
      [] {
        std::string text = rn::build_description();
        for (const rn::LibraryVersion& l : rn::library_versions())
          text += fmt::format("\n  {:<15} {}", l.name, l.version);
        return text;
      },
      "Print the build (version, git commit, build type, compiler) and the library versions it runs with");
  std::vector<rn::cli::Runner> runners;
  runners.push_back(rn::cli::add_train_command(app));
  runners.push_back(rn::cli::add_eval_command(app));
  runners.push_back(rn::cli::add_info_command(app));
  runners.push_back(rn::cli::add_bench_command(app));
  runners.push_back(rn::cli::add_export_command(app));
  runners.push_back(rn::cli::add_import_command(app));
  runners.push_back(rn::cli::add_pack_command(app));
  runners.push_back(rn::cli::add_doctor_command(app));
  runners.push_back(rn::cli::add_profile_command(app));
  runners.push_back(rn::cli::add_summary_command(app));
  runners.push_back(rn::cli::add_tune_command(app));
  runners.push_back(rn::cli::add_launch_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A mistyped command reads to CLI11 as no command and an extra word.
    if (argc > 1 && argv[1][0] != '-' && app.get_subcommands().empty()) {
      say_unknown_command(app, argv[1]);
      return 106;  // CLI11's status for a missing subcommand
    }
    const int rc = app.exit(e);
    // `launch` passes on what follows `--`; without it CLI11 sees the command's own options
    // as launch's and names them only as "not expected".
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr && app.got_subcommand("launch"))
      fmt::print(stderr,
                 "resnet launch: put the command to run after --, as in: resnet launch --rank-table ranks.json -- "
                 "train --config run.yaml\n");
    return rc;
  }
  try {
    for (auto& run : runners) {
      const int rc = run();
      if (rc < 0) continue;
      // A command's printed result that could not be written (a full disk, `> /dev/full`, a
      // closed pipe) is a failure, not a success with nothing to show. A training run's console
      // output is a copy of train.log, which it may lose (docs/training.md).
      if (!app.got_subcommand("train") && !app.got_subcommand("launch")) {
        errno = 0;
        if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
          const int err = errno;
          std::fputs(fmt::format("resnet: error: writing to standard output failed{}\n",
                                 err != 0 ? fmt::format(": {}", std::strerror(err)) : std::string())
                         .c_str(),
                     stderr);
          return 1;
        }
      }
      return rc;
    }
  } catch (const rn::Error& e) {
    // fputs, not fmt::print, which throws when the write fails (a closed pipe; SIGPIPE is
    // ignored during training): a throw here would end in std::terminate.
    std::fputs(fmt::format("resnet: error: {}\n", e.what()).c_str(), stderr);
    return 1;
  } catch (const std::exception& e) {
    // Expected failures are rn::Errors that name what is wrong. Anything else (out of
    // memory, a filesystem error, or a bug of ours) still ends with its message and a
    // status, not std::terminate.
    std::fputs(fmt::format("resnet: unexpected error: {}\n", e.what()).c_str(), stderr);
    return 1;
  }
  return 0;
}
