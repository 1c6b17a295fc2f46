#include "collective.h"

#include "check.h"

namespace mgpu {

void CollectiveMenu::add(const std::string& name, Maker make) {
  if (has(name)) throw Error("CollectiveMenu: '" + name + "' is on the menu already");
  makers_.emplace_back(name, std::move(make));
}

bool CollectiveMenu::has(const std::string& name) const {
  return std::any_of(makers_.begin(), makers_.end(), [&](const auto& m) { return m.first == name; });
}

std::unique_ptr<Collective> CollectiveMenu::make(const std::string& name, std::size_t max_elements) const {
  for (const auto& [n, maker] : makers_)
    if (n == name) return maker(max_elements);
  std::string choices;
  for (const std::string& n : names()) choices += (choices.empty() ? "" : ", ") + n;
  throw Error("no collective named '" + name + "' in this program (it has: " + (choices.empty() ? "none" : choices) +
              ")");
}

std::vector<std::string> CollectiveMenu::names() const {
  std::vector<std::string> out;
  for (const auto& m : makers_) out.push_back(m.first);
  return out;
}

}  // namespace mgpu
