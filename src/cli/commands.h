// Each subcommand registers itself on the app with an explicit call (no static
// registration) and returns the function to run when it is selected.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace rn::cli {

using Runner = std::function<int()>;

Runner add_info_command(CLI::App& app);
Runner add_bench_command(CLI::App& app);
Runner add_train_command(CLI::App& app);
Runner add_eval_command(CLI::App& app);
Runner add_export_command(CLI::App& app);
Runner add_import_command(CLI::App& app);
Runner add_pack_command(CLI::App& app);
Runner add_doctor_command(CLI::App& app);
Runner add_profile_command(CLI::App& app);
Runner add_summary_command(CLI::App& app);
Runner add_tune_command(CLI::App& app);
Runner add_launch_command(CLI::App& app);

// `--data PATH` of train and doctor: the --set options that read an image folder (or a packed
// one) with ImageNet's normalisation and, without a config, as many outputs as it has classes
// (or as a data.classes among the user's `user_sets` lists).
std::vector<std::string> data_sets(const std::string& path, bool has_config, const std::vector<std::string>& user_sets);

// Checks of numeric options whose messages read "must be > 0, got 0": CLI11's PositiveNumber
// and NonNegativeNumber print their range in full ("0.000000 to 179769313486231570814...").
CLI::Validator positive_number();
CLI::Validator non_negative_number();

}  // namespace rn::cli
