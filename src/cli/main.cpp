#include <iostream>
int main() { std::cout << "shardplan: not yet\n"; return 0; }
